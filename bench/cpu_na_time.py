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

import re

import torch
import torch.nn.functional as F

import fmha
from cpu_timing import median_seconds, parse_args, print_row, print_table_header
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


def main() -> None:
    args = parse_args(__doc__)
    dtype = args.torch_dtype
    print_table_header("SDPA+mask")
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

        fwd_ours = median_seconds(lambda: ours(), args.reps, args.clock)
        fwd_peer = median_seconds(lambda: peer(), args.reps, args.clock)
        both_ours = median_seconds(lambda: ours().backward(dout), args.reps, args.clock)
        both_peer = median_seconds(lambda: peer().backward(douts), args.reps, args.clock)
        print_row(name, (fwd_ours, fwd_peer, both_ours, both_peer), flops)


if __name__ == "__main__":
    main()
