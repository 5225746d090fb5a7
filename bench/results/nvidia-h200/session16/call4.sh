#!/usr/bin/env bash
# Session 16 call 4: where the persistent forward loses 3-5% at long rows (non-causal L 8192, SAM
# shapes): main's kernel (base_*), main's kernel with the output stored from registers as the
# persistent one does (base_direct_*, an experiment only), and this one (dyn2_*, each reader of
# the tile ring arriving itself), with a block a tile too. Then the build, the forward tests with
# 3 / 2 persistent blocks and compute-sanitizer.
cd "$(dirname "$0")/../../../.."
set -u
for d in d64 d128; do
  for b in base_$d base_direct_$d dyn2_$d; do
    echo "== $b"; timeout 60 .gpu/ablate/$b || echo "FAIL $b"
  done
  echo "== dyn2_$d FMHA_SM90_PERSISTENT=0"; FMHA_SM90_PERSISTENT=0 timeout 60 .gpu/ablate/dyn2_$d || echo "FAIL"
done 2>&1 | tee "$OUT/timing.txt"
STEPS="build persistent-tests sanitizer" CUDA_TESTS_SECONDS=200 SANITIZER_SECONDS=100 \
  SANITIZER_FILTER="CudaForward.HeadDimsNotMultipleOf8:CudaForward.Varlen:CudaForward.SinksAndExtraKeys:CudaForward.EmptyQueries" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
