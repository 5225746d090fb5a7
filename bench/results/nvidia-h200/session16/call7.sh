#!/usr/bin/env bash
# Session 16 call 7 (commit 786922c): the Python package
# with every head-dim bucket, pytest on CUDA, then the dense forward grid against FA2 and cuDNN,
# the SAM cases against cuDNN, and the rel-pos cases against compiled FlexAttention, one process
# each.
cd "$(dirname "$0")/../../../.."
set -u
STEPS="python bench" PYTEST_SECONDS=200 BENCH_SECONDS=170 \
  BENCH_RUNS="standard|--impls fmha,sdpa-flash,sdpa-cudnn --directions fwd --cases D(64|128)(.causal)?.L(512|2048|8192)$ --budget-ms 8 --no-plots;features|--impls fmha,sdpa-cudnn --directions fwd --cases SAM --budget-ms 8 --no-plots;features|--impls fmha,flex --directions fwd --cases rel-pos.SAM --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
