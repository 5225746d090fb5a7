#!/usr/bin/env bash
# Session 22 call 7: gpu-check on the test binary built on the development machine at 10f099a (the
# sm90 fp32 forward and backward): the CUDA suite, then compute-sanitizer (memcheck, racecheck) over
# the Float32Sm90Planes tests (the new kernels; the others unchanged since session 21's clean run).
# (A first try without the build step, which unpacks the prebuilt binary, ran nothing.)
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 PREBUILT=.gpu/prebuilt STEPS="build cuda-tests sanitizer" SANITIZER_SECONDS=150 \
  SANITIZER_FILTER="*Float32Sm90Planes*" PERSISTENT_RACECHECK_FILTER="CudaForward.Float32Sm90Planes" \
  bash scripts/gpu-check.sh
