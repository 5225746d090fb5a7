#!/usr/bin/env bash
# Session 16 call 3: the persistent forward with tiles of unequal work (windows, causal, varlen)
# taken dynamically from a counter, and TMA coordinates without a local array. Timed against main
# (base_*) and with a block a tile (FMHA_SM90_PERSISTENT=0); then the build, the forward tests,
# the forward tests with 3 / 2 persistent blocks, and compute-sanitizer (racecheck with two
# persistent blocks; memcheck and racecheck over a small forward filter).
cd "$(dirname "$0")/../../../.."
set -u
for d in d64 d128 d80; do
  for b in base_$d dyn_$d; do
    echo "== $b"; timeout 60 .gpu/ablate/$b || echo "FAIL $b"
  done
  echo "== dyn_$d FMHA_SM90_PERSISTENT=0"; FMHA_SM90_PERSISTENT=0 timeout 60 .gpu/ablate/dyn_$d || echo "FAIL"
done 2>&1 | tee "$OUT/timing.txt"
STEPS="build cuda-tests persistent-tests sanitizer" CUDA_TESTS_SECONDS=200 SANITIZER_SECONDS=100 \
  CUDA_TESTS_FILTER="CudaForward*:CudaWindow*" \
  SANITIZER_FILTER="CudaForward.HeadDimsNotMultipleOf8:CudaForward.Varlen:CudaForward.SinksAndExtraKeys:CudaForward.EmptyQueries" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
