#!/usr/bin/env bash
# Session 22 call 2: the Python host path with one check a forward (cfa0490, ee2ef4c): pytest on
# CUDA, bench/host_overhead.py, and the dense causal L 512 cells against FA2 with the default
# timing and with the GPU spinning 300 us after each flush (--queue-us, calls queued whole).
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 STEPS="python bench" BENCH_SECONDS=120 \
  BENCH_RUNS="standard|--impls fmha,sdpa-flash --directions fwd,bwd --cases causal.L512$ --budget-ms 8 --no-plots;standard|--impls fmha,sdpa-flash --directions fwd,bwd --cases causal.L512$ --budget-ms 8 --no-plots --queue-us 300" \
  bash scripts/gpu-check.sh
python3 bench/host_overhead.py
