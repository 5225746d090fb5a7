#!/usr/bin/env bash
# Session 16 call 5: the persistent forward with the output staged in shared memory again (a tile
# of its own up to D 96, Q's tile at D 128; call 4 measured the register stores at 9.5% of D 128
# L 8192), Q's barriers once per grid tile, the tile ring read by lane 0 of each warp. Timed
# against main (base_*) and with a block a tile; then the build, the forward, window and neighborhood tests, the
# forward tests on the cp.async path and with 3 / 2 persistent blocks, compute-sanitizer.
cd "$(dirname "$0")/../../../.."
set -u
for d in d64 d128 d80; do
  for b in base_$d st_$d; do
    echo "== $b"; timeout 60 .gpu/ablate/$b || echo "FAIL $b"
  done
  echo "== st_$d FMHA_SM90_PERSISTENT=0"; FMHA_SM90_PERSISTENT=0 timeout 60 .gpu/ablate/st_$d || echo "FAIL"
done 2>&1 | tee "$OUT/timing.txt"
STEPS="build cuda-tests cp-async-tests persistent-tests sanitizer" CUDA_TESTS_SECONDS=200 SANITIZER_SECONDS=100 \
  CUDA_TESTS_FILTER="CudaForward*:CudaWindow*:CudaNeighborhood*" \
  SANITIZER_FILTER="CudaForward.HeadDimsNotMultipleOf8:CudaForward.Varlen:CudaForward.SinksAndExtraKeys:CudaForward.EmptyQueries:CudaWindowMaskSmall*" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
