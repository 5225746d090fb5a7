#!/usr/bin/env bash
# Session 14 call 10 (H200): Nsight Compute on the fp32 backward's dK/dV kernel (the sm80 fused
# kernel on tf32 tensor cores, 3xTF32; 6.26 of the 6.3 ms backward in call 8), issue 4's fp32 case
# (B 4, H 16, L 2048, D 64), to choose its next step. The Python package alone, bucket 64.
cd "$(dirname "$0")/../../../.."
FMHA_CUDA_ARCHITECTURES=90a-real FMHA_HEAD_DIM_BUCKETS="64" CMAKE_BUILD_PARALLEL_LEVEL=16 \
  python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1 ||
  { echo "pip install failed"; tail -n 30 "$OUT/pip.log"; exit 1; }
mkdir -p "$OUT/ncu-out"
OUT="$OUT/ncu-out" CASE=fp32 KERNEL=backward_dkdv BACKWARD=1 NCU_SECONDS=300 bash scripts/ncu-kernels.sh
tar -czf "$OUT/ncu.tgz" -C "$OUT" ncu-out && rm -rf "$OUT/ncu-out"
