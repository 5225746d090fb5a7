"""fmha's fast CPU backend against PyTorch's CPU SDPA (its flash kernel), one thread each, timed in
CPU seconds of the calling thread (time.thread_time): on a shared machine other processes take wall
time from both, but not this thread's CPU time, so the ratios hold where wall-clock runs
(python -m fmha.bench --device cpu) are skewed by the machine's load. torch.set_num_threads(1)
keeps both on the calling thread (fmha's Python functions pass torch's thread count to the fast
backend). Random
normal inputs, B 1 H 8, the CPU standard suite's grid (fp32 / bf16, D 64 / 128, causal and not,
L 512-2048); best of 3 runs; GFLOP per CPU second over visible pairs, backward = 2.5 x forward.
Prints a markdown table.

    python bench/cpu_thread_time.py [--lengths 512,1024,2048] [--reps 3]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import fmha


def best_cpu_seconds(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def rates(forward, dout, flops: float, reps: int) -> tuple:
    """(forward, backward) GFLOP per CPU second of one implementation."""
    forward().backward(dout)  # warm-up
    fwd = best_cpu_seconds(forward, reps)
    out = forward()
    bwd = best_cpu_seconds(lambda: out.backward(dout, retain_graph=True), reps)
    return flops / fwd * 1e-9, 2.5 * flops / bwd * 1e-9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="512,1024,2048")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    B, H = 1, 8
    print(f"fmha's CPU kernels: {fmha._C.cpu_isa()}; torch {torch.__version__}\n")
    print("| dtype | D | causal | L | fmha fwd | torch fwd | fwd ratio | fmha bwd | torch bwd | bwd ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for D in (64, 128):
            for causal in (False, True):
                for L in (int(x) for x in args.lengths.split(",")):
                    q, k, v = (torch.randn(B, H, L, D, dtype=dtype, requires_grad=True)
                               for _ in range(3))
                    dout = torch.randn(B, H, L, D, dtype=dtype)
                    pairs = L * (L + 1) / 2 if causal else L * L
                    flops = 4 * pairs * D * H * B
                    ql, kl, vl = (t.transpose(1, 2) for t in (q, k, v))  # [B, L, H, D] views
                    ours = rates(lambda: fmha.attention(ql, kl, vl, causal=causal),
                                 dout.transpose(1, 2), flops, args.reps)
                    peer = rates(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                 dout, flops, args.reps)
                    print(f"| {name} | {D} | {'yes' if causal else 'no'} | {L} | {ours[0]:.0f} | "
                          f"{peer[0]:.0f} | {ours[0] / peer[0]:.2f}x | {ours[1]:.0f} | {peer[1]:.0f} | "
                          f"{ours[1] / peer[1]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
