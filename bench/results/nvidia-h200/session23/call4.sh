#!/usr/bin/env bash
# Session 23 call 4: compute-sanitizer at the session's final forward kernels (the test binary built
# here, PREBUILT, the same as call 3's): racecheck with 2 persistent blocks over the forward tests
# and the small neighborhood tests (the neighborhood forward's copy warpgroup walking many tiles),
# memcheck and racecheck over gpu-check's filter (its *Small* takes the neighborhood tests), and
# racecheck over the new CudaNeighborhood.PersistentBlocks (132 blocks, two or more tiles each).
# Then the device time by kernel of the 2-D and 3-D neighborhood cases, forward and backward
# (bench/profile_kernels.py), to see where the backward's time goes; pytest on CUDA before it.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PREBUILT=.gpu/prebuilt STEPS="build sanitizer python" \
  SANITIZER_SECONDS=240 bash scripts/gpu-check.sh
TESTS=build-gpu/prebuilt/fmha_cuda_tests
echo "== racecheck CudaNeighborhood.PersistentBlocks"
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 "$TESTS" --gtest_brief=1 \
  --gtest_filter="CudaNeighborhood.PersistentBlocks" 2>&1 | tail -n 4
for c in na2d-k13 na3d-k7; do
  echo "== profile_kernels $c"
  python3 bench/profile_kernels.py --case "$c" 2>&1 | tail -n 14
done
