#!/usr/bin/env bash
# Session 23 call 2: the sm90 neighborhood forward with a copy warpgroup and persistent blocks
# (the copy threads stage each grid tile's query box and key boxes). The test binary built here
# (PREBUILT), the whole CUDA suite, the forward and neighborhood tests again with 3 persistent
# blocks, then issue 5's neighborhood cases against compiled Flex in one process.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PREBUILT=.gpu/prebuilt PIP_BUCKETS="64;128" STEPS="build cuda-tests persistent-tests bench" \
  CUDA_TESTS_SECONDS=280 BENCH_SECONDS=240 \
  BENCH_RUNS="na|--impls fmha,flex --directions fwd,bwd --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
