#!/usr/bin/env bash
# Session 18 call 1 (main at a18ae65, the code of session 17 call 5): the Python package with every head-dim bucket, pytest on
# CUDA, then the SAM cases (bias [1, H, L, L], rel-pos, no bias; forward and backward) against
# cuDNN and the rel-pos cases against compiled FlexAttention, one process each.
cd "$(dirname "$0")/../../../.."
set -u
STEPS="python bench" PYTEST_SECONDS=200 BENCH_SECONDS=200 \
  BENCH_RUNS="features|--impls fmha,sdpa-cudnn --directions fwd,bwd --cases SAM --budget-ms 8 --no-plots;features|--impls fmha,flex --directions fwd --cases rel-pos.SAM --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
