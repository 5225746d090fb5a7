#!/usr/bin/env bash
# Session 16 call 8: gpu-check at the final device code (the forward's shared-memory layout moved
# to forward_smem.cuh; kernels otherwise as in call 7): build, the whole CUDA suite, the sm80
# kernels' tests, the forward tests on the cp.async path and with 3 / 2 persistent blocks, and
# compute-sanitizer with gpu-check's default filter plus the racecheck pass with two persistent
# blocks.
cd "$(dirname "$0")/../../../.."
set -u
STEPS="build cuda-tests sm80-tests cp-async-tests persistent-tests sanitizer" CUDA_TESTS_SECONDS=220 \
  SANITIZER_SECONDS=150 bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
