#!/usr/bin/env bash
# Session 21 call 6 (c50089c's kernels: the barriers' set-up as one helper; 18300c6 changed comments
# only): scripts/gpu-check.sh on the test binary prebuilt here: the CUDA suite, the forward and bias
# backward tests on the cp.async path, the sm80 kernels' pass; then compute-sanitizer memcheck and
# racecheck over the bias backward tests and the queued-copies test.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PREBUILT=.gpu/prebuilt STEPS="build cuda-tests cp-async-tests sm80-tests sanitizer" \
  SANITIZER_SECONDS=120 PERSISTENT_RACECHECK_FILTER="CudaForward.BiasStagedTiles" \
  SANITIZER_FILTER="CudaBackward.BiasStagedTiles:CudaBackward.GradientsCompleteForWorkQueuedBehind" \
  bash scripts/gpu-check.sh
