"""Neighborhood attention on fmha's fast CPU backend against PyTorch's best CPU path for the same
math: SDPA given the materialised boolean neighborhood mask (the mask built once, outside the
timing). Both in one process on the same random normal inputs, torch's intra-op thread count for
both (fmha's Python functions pass it to the fast backend); median of --reps runs after a warm-up,
forward and forward+backward, in wall time or (--clock thread, one thread) in CPU seconds of the
calling thread, which other processes on a shared machine do not skew. GFLOP/s over visible
pairs. Prints a markdown table.

    python bench/cpu_na_time.py [--threads 2] [--clock wall|thread] [--reps 5] [--cases REGEX]
"""
from __future__ import annotations

import argparse
import re
import statistics
import time

import torch
import torch.nn.functional as F

import fmha
from fmha.bench.cases import na
from fmha.bench.masks import na_visible

# (name, grid, kernel, dilation, causal per axis, B, H, D)
CASES = [
    ("NA1d L4096 K255 D64", (4096,), (255,), (1,), (False,), 1, 4, 64),
    ("NA1d L4096 K255 dil4 D64", (4096,), (255,), (4,), (False,), 1, 4, 64),
    ("NA2d 32x32 K7x7 D64", (32, 32), (7, 7), (1, 1), (False, False), 1, 8, 64),
    ("NA2d 64x64 K13x13 D64", (64, 64), (13, 13), (1, 1), (False, False), 1, 4, 64),
    ("NA2d 64x64 K7x7 dil2 D64", (64, 64), (7, 7), (2, 2), (False, False), 1, 4, 64),
    ("NA3d 16x16x16 K5x5x5 D64", (16, 16, 16), (5, 5, 5), (1, 1, 1), (False,) * 3, 1, 4, 64),
]
FUNCS = {1: fmha.na1d, 2: fmha.na2d, 3: fmha.na3d}


CLOCK = time.perf_counter


def median_seconds(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = CLOCK()
        fn()
        times.append(CLOCK() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--cases", default=".")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--clock", default="wall", choices=("wall", "thread"))
    args = p.parse_args()
    global CLOCK
    if args.clock == "thread":
        CLOCK = time.thread_time
        args.threads = 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    print(f"threads {args.threads}, {args.clock} clock, {args.dtype}, torch {torch.__version__}, "
          f"fmha {fmha.__version__}")
    print("| case | fmha fwd ms | SDPA+mask fwd ms | fwd ratio | fmha fwd+bwd ms | "
          "SDPA+mask fwd+bwd ms | fwd+bwd ratio | fmha GFLOP/s fwd |")
    print("|---|---|---|---|---|---|---|---|")
    for name, grid, kernel, dilation, causal, B, H, D in CASES:
        if not re.search(args.cases, name):
            continue
        case = na(name, B=B, H=H, grid=grid, kernel=kernel, dilation=dilation, D=D,
                  causal=causal, dtype=args.dtype)
        L = 1
        for x in grid:
            L *= x
        idx = torch.arange(L)
        mask = na_visible(case, idx[:, None], idx[None, :])
        pairs = int(mask.sum()) * B * H
        flops = 4 * pairs * D
        q, k, v = (torch.randn(B, *grid, H, D, dtype=dtype, requires_grad=True) for _ in range(3))
        dout = torch.randn(B, *grid, H, D, dtype=dtype)
        func = FUNCS[len(grid)]

        def ours():
            return func(q, k, v, list(kernel), list(dilation), list(causal))

        qs, ks, vs = (t.detach().reshape(B, L, H, D).transpose(1, 2).requires_grad_() for t in (q, k, v))
        douts = dout.reshape(B, L, H, D).transpose(1, 2)

        def peer():
            return F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)

        fwd_ours = median_seconds(lambda: ours(), args.reps)
        fwd_peer = median_seconds(lambda: peer(), args.reps)
        both_ours = median_seconds(lambda: ours().backward(dout), args.reps)
        both_peer = median_seconds(lambda: peer().backward(douts), args.reps)
        print(f"| {name} | {fwd_ours * 1e3:.2f} | {fwd_peer * 1e3:.2f} | {fwd_peer / fwd_ours:.1f}x | "
              f"{both_ours * 1e3:.2f} | {both_peer * 1e3:.2f} | {both_peer / both_ours:.1f}x | "
              f"{flops / fwd_ours * 1e-9:.0f} |", flush=True)


if __name__ == "__main__":
    main()
