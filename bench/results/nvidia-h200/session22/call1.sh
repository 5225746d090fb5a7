#!/usr/bin/env bash
# Session 22 call 1: the D 64 causal L 512 forward, kernel only. Today's sm90 forward against session
# 16's (6374d10, whose in-process run was 1.09x FA2), each with persistent blocks (default) and a
# block a tile (FMHA_SM90_PERSISTENT=0), alternating, then FA2 (SDPA flash) timed the same way
# (events, L2 flushed by a 256 MB memset before each run, median of 50).
cd "$(dirname "$0")/../../../.."
set -u
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p .gpu/s22/bin
NV="nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a -DFMHA_TIMING_BUCKET=64 -DFMHA_TIMING_D=64"
$NV -Isrc -Iinclude -DVARIANT='"main"' -o .gpu/s22/bin/main bench/cpp/sm90_forward_timing.cu src/cuda/workspace_pool.cu -lcuda &
(cd .gpu/s22/s16 && $NV -Isrc -Iinclude -DVARIANT='"s16"' -o ../bin/s16 bench/cpp/sm90_forward_timing.cu src/cuda/workspace_pool.cu -lcuda) &
wait
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
for round in 1 2; do
  for v in main s16; do
    .gpu/s22/bin/$v
    FMHA_SM90_PERSISTENT=0 .gpu/s22/bin/$v | sed "s/^/persistent=0 /"
  done
done
python3 - <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
def med(fn, runs=50):
    for _ in range(3): fn()
    ts = []
    for _ in range(runs):
        flush.zero_()
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts)//2], ts[len(ts)//10], ts[len(ts)*9//10]
for L, causal in [(512, False), (512, True), (2048, True)]:
    B, H, D = 16384 // L, 32, 64
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        m, p10, p90 = med(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    print(f"FA2 D=64 B={B} H={H} L={L} causal={int(causal)} median {m:.4f} ms p10 {p10:.4f} p90 {p90:.4f}")
PY
