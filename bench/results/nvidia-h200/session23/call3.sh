#!/usr/bin/env bash
# Session 23 call 3: the neighborhood forward's copy warpgroup with 56 / 224 registers (copy / math
# threads) instead of 40 / 232. The test binary built here (PREBUILT): the forward and
# neighborhood tests, again with 3 persistent blocks, then the 2-D and 3-D neighborhood cases
# against compiled Flex in one process.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PREBUILT=.gpu/prebuilt PIP_BUCKETS="64;128" \
  STEPS="build cuda-tests persistent-tests bench" \
  CUDA_TESTS_FILTER="CudaForward*:CudaNeighborhood*" CUDA_TESTS_SECONDS=200 \
  BENCH_SECONDS=150 BENCH_RUNS="na|--impls fmha,flex --directions fwd,bwd --cases NA[23]d --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
