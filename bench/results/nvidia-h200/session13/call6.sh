#!/usr/bin/env bash
# Session 13 call 6 (H200): Nsight Compute on the NA 2-D 64x64 K13 forward at D 64 (after the
# bit-mask window test), to see where its blocks go now. The Python package alone, bucket 64.
cd "$(dirname "$0")/../../../.."
FMHA_CUDA_ARCHITECTURES=90a-real FMHA_HEAD_DIM_BUCKETS="64" CMAKE_BUILD_PARALLEL_LEVEL=16 \
  python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1 ||
  { echo "pip install failed"; tail -n 30 "$OUT/pip.log"; exit 1; }
mkdir -p "$OUT/ncu-out"
OUT="$OUT/ncu-out" CASE=na2d-k13 KERNEL=forward_kernel bash scripts/ncu-kernels.sh
tar -czf "$OUT/ncu.tgz" -C "$OUT" ncu-out && rm -rf "$OUT/ncu-out"
