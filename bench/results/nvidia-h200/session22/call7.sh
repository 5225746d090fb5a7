#!/usr/bin/env bash
# Session 22 call 7: gpu-check on the test binary built on the development machine at 2a38089 (the
# sm90 fp32 forward and backward): the CUDA suite, the sm80 kernels' suite, and compute-sanitizer
# (memcheck, racecheck) over its default filter, which now takes the Float32Sm90Planes tests too.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PREBUILT=.gpu/prebuilt STEPS="cuda-tests sm80-tests sanitizer" SANITIZER_SECONDS=240 \
  bash scripts/gpu-check.sh
