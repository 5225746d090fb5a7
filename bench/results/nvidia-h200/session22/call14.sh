#!/usr/bin/env bash
# Session 22 call 14: gpu-check at the final kernel code (the sm90 fp32 backward's sums exchanged in
# shared memory of their own across two block barriers, dK/dV and dQ): the CUDA suite on the test
# binary built on the development machine, then memcheck and racecheck over the Float32Sm90Planes
# tests.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PREBUILT=.gpu/prebuilt STEPS="build cuda-tests sanitizer" SANITIZER_SECONDS=150 \
  SANITIZER_FILTER="*Float32Sm90Planes*" PERSISTENT_RACECHECK_FILTER="CudaForward.Float32Sm90Planes" \
  bash scripts/gpu-check.sh
