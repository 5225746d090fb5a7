#!/usr/bin/env bash
# Session 20 call 4 (the session's final kernel code: the dQ kernel overlapping the dK/dV kernel,
# 3e10bf8; the rendezvous helper, c2ef4b4, SASS-identical): scripts/gpu-check.sh on the test binary
# prebuilt at the final test code (scripts/build-gpu-tests.sh): the whole CUDA suite, then racecheck
# over the forward tests with two persistent blocks, and memcheck and racecheck over the backward
# tests whose blocks walk many key tiles, one or none, the new queued-copies test and the forward's
# test without keys (the refused tensor map of session 19).
cd "$(dirname "$0")/../../../.."
set -u
BWD="CudaBackward.OddShapesAndHeadDims:CudaBackward.CausalBothAlignments:CudaBackward.Varlen"
BWD="$BWD:CudaBackward.BiasStagedTiles:CudaBackward.BiasRegisterForm:CudaBackward.WindowsAndFullyMaskedRows"
BWD="$BWD:CudaBackward.FusedAtBuckets64And128:CudaBackward.GradientsCompleteForWorkQueuedBehind"
BWD="$BWD:CudaForward.WindowsAndFullyMaskedRows"
PACK_ONLY=1 PREBUILT=.gpu/prebuilt STEPS="build cuda-tests sanitizer" CUDA_TESTS_SECONDS=280 SANITIZER_SECONDS=150 \
  SANITIZER_FILTER="$BWD" bash scripts/gpu-check.sh
cd "${OUT:-build-gpu}" && tar -xzf gpu-check.tgz && grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|API error|Program hit" gpu-check/sanitizer.log | sort | uniq -c | head -n 20
rm -rf gpu-check
