#!/usr/bin/env bash
# Session 23 call 1: main at the start of the session (1adb33d): issue 5's neighborhood cases
# against compiled Flex, in one process (the package built for head-dim buckets 64 and 128).
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PIP_BUCKETS="64;128" STEPS="bench" BENCH_SECONDS=300 \
  BENCH_RUNS="na|--impls fmha,flex --directions fwd,bwd --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
