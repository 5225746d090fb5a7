#!/usr/bin/env bash
# Session 21 call 5 (3de079f's kernels, the prebuilt test binary): compute-sanitizer over the
# tests of the bias tiles by TMA: racecheck over the forward's (two persistent blocks), memcheck
# and racecheck over the backward's and the queued-copies test, then memcheck over the backward's
# again on the cp.async path (FMHA_SM90_TMA=0).
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PREBUILT=.gpu/prebuilt STEPS="build sanitizer" SANITIZER_SECONDS=250 \
  PERSISTENT_RACECHECK_FILTER="CudaForward.BiasStagedTiles" \
  SANITIZER_FILTER="CudaBackward.BiasStagedTiles:CudaBackward.GradientsCompleteForWorkQueuedBehind" \
  bash scripts/gpu-check.sh
FMHA_SM90_TMA=0 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 \
  build-gpu/prebuilt/fmha_cuda_tests --gtest_brief=1 --gtest_filter="CudaBackward.BiasStagedTiles" |
  tail -n 4
