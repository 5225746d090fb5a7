#!/usr/bin/env bash
# Session 14 call 1 (H200): issue 4's cells not yet timed on this GPU, at main as session 13 left it
# (c285fd6; no kernel change). The Python package alone (buckets 64;128;256), then, one process each:
# 1. the D 256 backward's device time by kernel (bench/profile_kernels.py), plain and causal;
# 2. the dense grid at D 256, L 512 / 2048 / 8192, causal and not, against FA2 and cuDNN;
# 3. GQA and fp32 (features suite) against FA2, the efficient backend and cuDNN;
# 4. the memory suite (peak extra memory of forward + backward) against FA2.
cd "$(dirname "$0")/../../../.."
set -u
START=$(date +%s)
left() { echo $(( ${1:-580} - ($(date +%s) - START) )); }
mkdir -p "$OUT/logs"
trap 'tar -czf "$OUT/call.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"' EXIT
nvidia-smi -L
FMHA_CUDA_ARCHITECTURES=90a-real FMHA_HEAD_DIM_BUCKETS="64;128;256" CMAKE_BUILD_PARALLEL_LEVEL=16 \
  python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/logs/pip.log" 2>&1 ||
  { echo "pip install failed"; tail -n 30 "$OUT/logs/pip.log"; exit 1; }
echo "installed after $(( $(date +%s) - START )) s"
for c in dense-d256 dense-d256-causal; do
  timeout 60 python3 bench/profile_kernels.py --case $c 2>&1 | tee -a "$OUT/logs/profile.log"
done
timeout "$(left 380)" python3 -m fmha.bench --suite standard --impls fmha,sdpa-flash,sdpa-cudnn \
  --directions fwd,bwd --cases 'D256( causal)? L(512|2048|8192)$' --budget-ms 10 --no-plots \
  --out "$OUT/logs/standard" >"$OUT/logs/standard.log" 2>&1
echo "standard exit $?"; cat "$OUT/logs/standard/summary.txt" 2>/dev/null
timeout "$(left 500)" python3 -m fmha.bench --suite features \
  --impls fmha,sdpa-flash,sdpa-efficient,sdpa-cudnn --directions fwd,bwd --cases 'GQA|fp32' \
  --budget-ms 10 --no-plots --out "$OUT/logs/features" >"$OUT/logs/features.log" 2>&1
echo "features exit $?"; cat "$OUT/logs/features/summary.txt" 2>/dev/null
timeout "$(left 580)" python3 -m fmha.bench --suite memory --impls fmha,sdpa-flash --no-plots \
  --out "$OUT/logs/memory" >"$OUT/logs/memory.log" 2>&1
echo "memory exit $?"; cat "$OUT/logs/memory/summary.txt" 2>/dev/null
