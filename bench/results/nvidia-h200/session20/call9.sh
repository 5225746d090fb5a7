#!/usr/bin/env bash
# Session 20 call 9 (84dfb3f: the overlapped launch's fallback, host code only):
# scripts/gpu-check.sh's python and bench steps: pytest on CUDA (with the CUDA-graph capture test),
# and the SAM-B backward with and without the [1, H, L, L] bias against cuDNN.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 STEPS="python bench" BENCH_SECONDS=100 \
  BENCH_RUNS="features|--impls fmha,sdpa-cudnn --directions bwd --cases ^(bias|no-bias).*SAM-B --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
