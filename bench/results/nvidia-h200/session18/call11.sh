#!/usr/bin/env bash
# Session 18 call 11 (the backward preprocess on 16-byte chunks, uncommitted at the time, on top of
# d51e6e0): the build, the whole CUDA suite, memcheck over backward tests that take both
# preprocess kernels, the Python package and pytest on CUDA, the SAM-B backward against cuDNN and
# the fp32 case against the efficient backend in one process each, and the device time by kernel
# of SAM-B with a [1, H, L, L] bias.
cd "$(dirname "$0")/../../../.."
set -u
STEPS="build cuda-tests python bench" CUDA_TESTS_SECONDS=200 PYTEST_SECONDS=120 BENCH_SECONDS=100 \
  BENCH_RUNS="features|--impls fmha,sdpa-cudnn --directions bwd --cases SAM-B --budget-ms 8 --no-plots;features|--impls fmha,sdpa-efficient --directions fwd,bwd --cases fp32.B4 --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
{
  echo "## memcheck"
  timeout 80 compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/fmha_cuda_tests \
    --gtest_brief=1 --gtest_filter="CudaBackward.HeadDimsNotMultipleOf8:CudaBackward.Varlen:CudaBackward.SinksAndExtraKeys" 2>&1 | tail -n 3
  timeout 40 python3 bench/profile_kernels.py --case sam-b-bias 2>&1 | grep -v -i warn
} | tee "$OUT/extra.txt"
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
