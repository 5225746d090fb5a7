#!/usr/bin/env bash
# Session 21 call 9 (the eager path: Python calls on plain tensors skip torch's custom-op
# machinery): the package installed as a user would, pytest on CUDA, bench/host_overhead.py again,
# and the dense causal L 512 cells (D 64 / 128 / 256) against FA2, whose forward had spread widely.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 STEPS="python bench" BENCH_SECONDS=120 \
  BENCH_RUNS="standard|--impls fmha,sdpa-flash --directions fwd,bwd --cases causal.L512$ --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
python3 bench/host_overhead.py
