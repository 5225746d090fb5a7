#!/usr/bin/env bash
# Session 18 call 10 (main at the session's last kernel commit): the build, the whole CUDA suite,
# the Python package and pytest on CUDA, then issue 4's fp32 case against the efficient backend
# in one process, and the device time by kernel of the fp32 case and of SAM-B with a
# [1, H, L, L] bias (what of the backward's time is outside its two kernels).
cd "$(dirname "$0")/../../../.."
set -u
STEPS="build cuda-tests python bench" CUDA_TESTS_SECONDS=220 PYTEST_SECONDS=200 BENCH_SECONDS=150 \
  BENCH_RUNS="features|--impls fmha,sdpa-efficient --directions fwd,bwd --cases fp32.B4 --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
for c in fp32 sam-b-bias sam-b; do
  timeout 60 python3 bench/profile_kernels.py --case $c
done 2>&1 | grep -v Warn | tee "$OUT/profile.txt"
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
