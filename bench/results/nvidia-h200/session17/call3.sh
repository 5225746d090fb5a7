#!/usr/bin/env bash
# Session 17 call 3: the bias policy's tiles staged in the dQ kernel (cp.async with K / V, read
# with ldmatrix; D <= 64), timed against main (kernel only: .gpu/s17/{base,new}_bwd built here by
# bench/cpp/sm90_backward_timing.cu's command from main and from the working tree, twice each);
# then the build and the backward tests, racecheck and memcheck over the bias tests.
cd "$(dirname "$0")/../../../.."
set -u
{
  for b in base_bwd new_bwd base_bwd new_bwd; do echo "== $b"; timeout 30 .gpu/s17/$b; done
} 2>&1 | tee "$OUT/timing.txt"
STEPS="build cuda-tests sanitizer" CUDA_TESTS_SECONDS=200 SANITIZER_SECONDS=120 \
  CUDA_TESTS_FILTER="CudaBackward*" \
  PERSISTENT_RACECHECK_FILTER="CudaForward.BiasStagedTiles" \
  SANITIZER_FILTER="CudaBackward.BiasStagedTiles:CudaBackward.BiasOnWholeChunkRows" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
