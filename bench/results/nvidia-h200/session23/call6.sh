#!/usr/bin/env bash
# Session 23 call 6: ping-pong in the neighborhood backward (the dQ kernel up to D 128, the dK/dV
# kernel at D 64, neighborhood attention without score modifiers; their box rings one larger).
# The test binary built here (PREBUILT): the backward and neighborhood tests, racecheck over the
# small neighborhood backward tests, then issue 5's neighborhood cases against compiled Flex in
# one process (backward only; it ran past BENCH_SECONDS before writing its table: call 7 reruns it).
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PREBUILT=.gpu/prebuilt PIP_BUCKETS="64;128" STEPS="build cuda-tests bench" \
  CUDA_TESTS_FILTER="CudaBackward*:CudaNeighborhood*" CUDA_TESTS_SECONDS=240 BENCH_SECONDS=200 \
  BENCH_RUNS="na|--impls fmha,flex --directions bwd --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
echo "== racecheck CudaNeighborhoodBackwardSmall.*"
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/prebuilt/fmha_cuda_tests \
  --gtest_brief=1 --gtest_filter="CudaNeighborhoodBackwardSmall.*" 2>&1 | tail -n 3
