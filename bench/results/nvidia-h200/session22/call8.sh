#!/usr/bin/env bash
# Session 22 call 8: the package installed as a user would, pytest on CUDA, then in one process per
# suite: issue 4's fp32 case (plain and causal) against the efficient backend, the dense grid
# (D 64 / 128 / 256, L 512 / 2048 / 8192, causal and not) against FA2, and bench/host_overhead.py.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 STEPS="python bench" BENCH_SECONDS=240 \
  BENCH_RUNS="features|--impls fmha,sdpa-efficient --directions fwd,bwd --cases ^fp32 --budget-ms 8 --no-plots;standard|--impls fmha,sdpa-flash --directions fwd,bwd --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
python3 bench/host_overhead.py
