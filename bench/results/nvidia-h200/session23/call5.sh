#!/usr/bin/env bash
# Session 23 call 5: the session's final code (the same kernels as calls 3-4): issue 5's
# neighborhood cases against compiled Flex in one process, then our dense kernel at the 2-D 64x64
# grid's length (L 4096, D 64 / 128), fmha only, for the issue's useful-throughput ratio.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PIP_BUCKETS="64;128" STEPS="bench" BENCH_SECONDS=280 \
  BENCH_RUNS="na|--impls fmha,flex --directions fwd,bwd --budget-ms 8 --no-plots;standard|--impls fmha --directions fwd,bwd --cases D(64|128).L4096$ --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
