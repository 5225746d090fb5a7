#!/usr/bin/env bash
# Session 13 call 5 (H200): issue 4's tables on this GPU (they were all on an H100 before), main at
# the session's NA changes (no dense kernel changed this session). The Python package alone
# (buckets 64;96;128: D 64, SAM-H's D 80, D 128), then in one process each:
# 1. the dense grid at D 64 / 128, L 512 / 2048 / 8192, causal and not, against FA2 and cuDNN;
# 2. the SAM shapes (rel-pos, the same attention without bias, a [1, H, L, L] bias fixed and
#    learned) against cuDNN, the efficient backend and compiled Flex.
cd "$(dirname "$0")/../../../.."
set -u
START=$(date +%s)
left() { echo $(( ${1:-560} - ($(date +%s) - START) )); }
mkdir -p "$OUT/logs"
trap 'tar -czf "$OUT/call.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"' EXIT
nvidia-smi -L
FMHA_CUDA_ARCHITECTURES=90a-real FMHA_HEAD_DIM_BUCKETS="64;96;128" CMAKE_BUILD_PARALLEL_LEVEL=16 \
  python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/logs/pip.log" 2>&1 ||
  { echo "pip install failed"; tail -n 30 "$OUT/logs/pip.log"; exit 1; }
echo "installed after $(( $(date +%s) - START )) s"
timeout "$(left 330)" python3 -m fmha.bench --suite standard --impls fmha,sdpa-flash,sdpa-cudnn \
  --directions fwd,bwd --cases 'D(64|128)( causal)? L(512|2048|8192)$' --budget-ms 10 --no-plots \
  --out "$OUT/logs/standard" >"$OUT/logs/standard.log" 2>&1
echo "standard exit $?"; cat "$OUT/logs/standard/summary.txt" 2>/dev/null
timeout "$(left 585)" python3 -m fmha.bench --suite features \
  --impls fmha,sdpa-cudnn,sdpa-efficient,flex --directions fwd,bwd --cases 'SAM' --budget-ms 10 \
  --no-plots --out "$OUT/logs/sam" >"$OUT/logs/sam.log" 2>&1
echo "sam exit $?"; cat "$OUT/logs/sam/summary.txt" 2>/dev/null
