#!/usr/bin/env bash
# Session 16 call 1: persistent blocks for the sm90 forward with a copy warpgroup (one block an SM
# walks the grid's tiles; the next tile's Q and first K/V groups load under the previous tile's
# last phase and epilogue; the output stored from registers). The forward timed by .gpu/ablate:
# main's kernel (base_*), this one (pers_*), and this one with a block a tile
# (FMHA_SM90_PERSISTENT=0), at D 64, 128 and 80 (bucket 96). Then the build, the forward tests,
# the forward tests with 3 / 2 persistent blocks (TMA / cp.async).
cd "$(dirname "$0")/../../../.."
set -u
for d in d64 d128 d80; do
  for b in base_$d pers_$d; do
    echo "== $b"; timeout 60 .gpu/ablate/$b || echo "FAIL $b"
  done
  echo "== pers_$d FMHA_SM90_PERSISTENT=0"; FMHA_SM90_PERSISTENT=0 timeout 60 .gpu/ablate/pers_$d || echo "FAIL"
done 2>&1 | tee "$OUT/timing.txt"
STEPS="build cuda-tests persistent-tests" CUDA_TESTS_SECONDS=200 \
  CUDA_TESTS_FILTER="CudaForward*:CudaWindow*" bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
