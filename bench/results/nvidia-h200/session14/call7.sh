#!/usr/bin/env bash
# Session 14 call 7 (H200): the final code's checks that call 6 did not run. Build (C++ suite all
# buckets; the Python package all buckets in the background), compute-sanitizer memcheck and
# racecheck over the small dense and neighborhood tests, the wide-head tests (the D > 128 dK and
# dV kernels) and the dilation-group tests (the merged group loop), then pytest on CUDA tensors.
cd "$(dirname "$0")/../../../.."
set -u
STEPS="build sanitizer python" SANITIZER_SECONDS=170 PYTEST_SECONDS=200 \
  SANITIZER_FILTER="CudaBackward.OddShapesAndHeadDims:CudaBackward.WideHeadsWithMasksAndGqa:CudaNeighborhoodSmall*:CudaNeighborhoodBackwardSmall*:CudaNeighborhood*DilationGroups*" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
