#!/usr/bin/env bash
# Session 21 call 4 (3de079f's kernels): scripts/gpu-check.sh on the test binary prebuilt here
# (scripts/build-gpu-tests.sh, carried in .gpu): the CUDA suite, the forward and bias backward
# tests again on the cp.async path, the package installed as a user would, pytest on CUDA, and the
# bias cell against cuDNN (SAM-B backward with and without the [1, H, L, L] bias) and the learned
# bias (dbias) against the efficient backend; then the
# kernel timings of `tma3` (3de079f) against `pp` (the bias dK/dV kernel in ping-pong too).
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PREBUILT=.gpu/prebuilt STEPS="build cuda-tests cp-async-tests python bench" BENCH_SECONDS=200 \
  BENCH_RUNS="features|--impls fmha,sdpa-cudnn --directions bwd --cases ^(bias|no-bias).*SAM-B --budget-ms 8 --no-plots;features|--impls fmha,sdpa-efficient --directions bwd --cases ^dbias.*SAM-B --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
(cd .gpu/s21 && for v in tma3 pp; do timeout 100 ./$v | grep -v digest | grep "bias=1"; done)
