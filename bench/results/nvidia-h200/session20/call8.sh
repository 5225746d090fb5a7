#!/usr/bin/env bash
# Session 20 call 8 (75b12fe: the final kernel code, after the sequence_rows helper of df3a43a):
# scripts/gpu-check.sh on the test binary prebuilt there: the whole CUDA suite, then the dense and
# neighborhood tests again on the sm80 kernels (FMHA_CUDA_KERNELS=sm80), whose forward the helper
# touched (register names only).
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PREBUILT=.gpu/prebuilt STEPS="build cuda-tests sm80-tests" CUDA_TESTS_SECONDS=280 \
  bash scripts/gpu-check.sh
