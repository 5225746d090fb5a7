#!/usr/bin/env bash
# Session 18 call 5: the fp32 changes (zeroed accumulators take the 3xTF32 products straight, dQ
# pairs as 8-byte reductions, K / V split once in the dK/dV kernel) through the GPU suite: the
# build, the whole CUDA suite, the sm80 backward tests of the 16-bit types (the fused kernel's dQ
# reductions changed for them too), and racecheck / memcheck over the fp32 backward features
# (the in-place split of K and V and its barrier).
cd "$(dirname "$0")/../../../.."
set -u
STEPS="build cuda-tests" CUDA_TESTS_SECONDS=220 bash scripts/gpu-check.sh
T=build-gpu/tests/fmha_cuda_tests
{
  echo "## sm80 backward (16-bit)"
  FMHA_CUDA_KERNELS=sm80 timeout 120 "$T" --gtest_brief=1 \
    --gtest_filter="CudaBackward*:CudaNeighborhoodBackward*:-*Float32*" 2>&1 | tail -n 3
  for tool in racecheck memcheck; do
    echo "## $tool CudaBackward.Float32Features"
    timeout 80 compute-sanitizer --tool $tool --error-exitcode 1 "$T" --gtest_brief=1 \
      --gtest_filter="CudaBackward.Float32Features" 2>&1 | tail -n 4
  done
} | tee "$OUT/extra-tests.txt"
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
