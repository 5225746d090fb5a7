#!/usr/bin/env bash
# Session 20 call 5 (final code): scripts/gpu-check.sh's Python steps: the package installed as a
# user would, pytest on CUDA, and the benchmarks in one process each: SAM-B backward with and without
# the [1, H, L, L] bias against cuDNN; the dense D 64 / 128 backward against FA2 and cuDNN.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 STEPS="python bench" BENCH_SECONDS=200 \
  BENCH_RUNS="features|--impls fmha,sdpa-cudnn --directions bwd --cases ^(bias|no-bias).*SAM-B --budget-ms 8 --no-plots;standard|--impls fmha,sdpa-flash,sdpa-cudnn --directions bwd --cases D(64|128)(.causal)?.L(512|2048|8192)$ --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
