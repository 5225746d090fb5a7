#!/usr/bin/env bash
# Session 17 call 2 (call 1 hung in the staged bias: its ring's full barrier had expect_tx but no
# arrival): the bias policy's staged form (the copy warpgroup copies each key tile's bias by TMA
# into a ring of two tiles; D <= 64), timed against main (kernel only, .gpu/s17 built here from main and from the working tree by
# bench/cpp/sm90_forward_timing.cu's command); then the build and the forward tests (the whole
# CudaForward suite, with persistent blocks, on the cp.async path), racecheck over the bias tests
# with two persistent blocks.
cd "$(dirname "$0")/../../../.."
set -u
{
  for b in base_d64 new_d64 base_d64 new_d64; do echo "== $b bias"; timeout 20 .gpu/s17/$b bias; done
} 2>&1 | tee "$OUT/timing.txt"
STEPS="build cuda-tests cp-async-tests persistent-tests sanitizer" CUDA_TESTS_SECONDS=120 SANITIZER_SECONDS=120 \
  CUDA_TESTS_FILTER="CudaForward*:CudaBlockOrder*" \
  PERSISTENT_RACECHECK_FILTER="CudaForward.BiasStagedTiles:CudaForward.BiasRegisterForm" \
  SANITIZER_FILTER="CudaForward.BiasStagedTiles:CudaForward.Varlen" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
