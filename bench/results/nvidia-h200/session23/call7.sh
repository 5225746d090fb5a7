#!/usr/bin/env bash
# Session 23 call 7: call 6's benchmark again (its run ran past its 200 s limit before writing its
# table), the 2-D and 3-D neighborhood cases only (the ones that run on token tiles), backward,
# against compiled Flex in one process, at call 6's code (ping-pong in the neighborhood backward).
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PIP_BUCKETS="64;128" STEPS="bench" BENCH_SECONDS=300 \
  BENCH_RUNS="na|--impls fmha,flex --directions bwd --cases NA[23]d --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
