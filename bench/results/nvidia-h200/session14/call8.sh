#!/usr/bin/env bash
# Session 14 call 8 (H200): GQA against the same query shape without it (H = Hkv = 32), at the
# final code (head sections), against FA2 and cuDNN; and the fp32 case's device time by kernel, for
# the next step on its backward. The Python package alone (buckets 64;128).
cd "$(dirname "$0")/../../../.."
set -u
mkdir -p "$OUT/logs"
trap 'tar -czf "$OUT/call.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"' EXIT
FMHA_CUDA_ARCHITECTURES=90a-real FMHA_HEAD_DIM_BUCKETS="64;128" CMAKE_BUILD_PARALLEL_LEVEL=16 \
  python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/logs/pip.log" 2>&1 ||
  { echo "pip install failed"; tail -n 30 "$OUT/logs/pip.log"; exit 1; }
timeout 200 python3 -m fmha.bench --suite features --impls fmha,sdpa-flash,sdpa-cudnn \
  --directions fwd,bwd --cases 'GQA|MHA' --budget-ms 10 --no-plots --out "$OUT/logs/gqa" \
  >"$OUT/logs/gqa.log" 2>&1
echo "gqa exit $?"; cat "$OUT/logs/gqa/summary.txt" 2>/dev/null
timeout 60 python3 bench/profile_kernels.py --case fp32 2>&1 | grep -v Warn | tee "$OUT/logs/profile-fp32.txt"
