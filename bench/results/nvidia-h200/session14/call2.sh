#!/usr/bin/env bash
# Session 14 call 2 (H200): above D 128 the sm90 dK/dV work split by output (one kernel
# accumulating dV, one dK) instead of two column chunks that both recompute S^T and dP^T. Build
# (C++ suite all buckets, Python package buckets 64;128;256), the whole CUDA suite, the D 256
# backward's device time by kernel, then the D 256 cells against FA2 and cuDNN in one process.
cd "$(dirname "$0")/../../../.."
set -u
export PIP_BUCKETS="64;128;256"
STEPS="build cuda-tests bench" CUDA_TESTS_SECONDS=240 BENCH_SECONDS=200 \
  BENCH_RUNS="standard|--impls fmha,sdpa-flash,sdpa-cudnn --directions fwd,bwd --cases D256(.causal)?.L(512|2048|8192)$ --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
for c in dense-d256 dense-d256-causal; do
  timeout 60 python3 bench/profile_kernels.py --case $c 2>&1 | grep -v Warn | tee -a "$OUT/gpu-check/profile.log"
done
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
