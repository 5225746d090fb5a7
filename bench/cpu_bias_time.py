"""SAM rel-pos and an additive bias on fmha's fast CPU backend against PyTorch's best CPU path for the
same math: SDPA given the materialised float bias. For rel-pos the bias is built from rel_h and rel_w
inside the timed call (it depends on the inputs, and the gradients of rel_h / rel_w flow through
it); an additive bias is an input of both. Both in one process on the same random normal inputs,
torch's intra-op thread count for both (fmha's Python functions pass it to the fast backend);
median of --reps runs after a warm-up, forward and forward+backward (every input's gradient), in
wall time or (--clock thread, one thread) CPU seconds of the calling thread, which other processes
on a shared machine do not skew. GFLOP/s over all pairs (no mask). Prints a markdown table.

    python bench/cpu_bias_time.py [--threads 2] [--clock wall|thread] [--reps 5] [--cases REGEX]
"""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F

import fmha
from cpu_timing import median_seconds, parse_args, print_row, print_table_header

# (name, kind, B, H, key grid (rows, cols) for rel-pos or L for a bias, D)
CASES = [
    ("SAM rel-pos 32x32 H8 D64", "relpos", 1, 8, (32, 32), 64),
    ("SAM rel-pos 64x64 H2 D64", "relpos", 1, 2, (64, 64), 64),
    ("bias [1,H,L,L] L1024 H8 D64", "bias", 1, 8, 1024, 64),
    ("bias [1,H,L,L] L2048 H4 D64", "bias", 1, 4, 2048, 64),
]


def main() -> None:
    args = parse_args(__doc__)
    dtype = args.torch_dtype
    print_table_header("SDPA+bias")
    for name, kind, B, H, shape, D in CASES:
        if not re.search(args.cases, name):
            continue
        L = shape[0] * shape[1] if kind == "relpos" else shape
        flops = 4 * B * H * L * L * D
        q, k, v = (torch.randn(B, L, H, D, dtype=dtype, requires_grad=True) for _ in range(3))
        dout = torch.randn(B, L, H, D, dtype=dtype)
        qs, ks, vs = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
        douts = dout.transpose(1, 2)
        if kind == "relpos":
            rows, cols = shape
            rel_h = (0.5 * torch.randn(B, H, L, rows, dtype=dtype)).requires_grad_()
            rel_w = (0.5 * torch.randn(B, H, L, cols, dtype=dtype)).requires_grad_()
            inputs = (q, k, v, rel_h, rel_w)
            peer_inputs = (qs, ks, vs, rel_h, rel_w)

            def ours():
                return fmha.attention(q, k, v, rel_pos=(rel_h, rel_w))

            def peer():  # SAM's own form: the [L, rows, cols] sum, flattened to the key axis
                bias = (rel_h[..., :, None] + rel_w[..., None, :]).reshape(B, H, L, L)
                return F.scaled_dot_product_attention(qs, ks, vs, attn_mask=bias)
        else:
            bias = (0.5 * torch.randn(1, H, L, L, dtype=dtype)).requires_grad_()
            inputs = (q, k, v, bias)
            peer_inputs = (qs, ks, vs, bias)

            def ours():
                return fmha.attention(q, k, v, bias=bias)

            def peer():
                return F.scaled_dot_product_attention(qs, ks, vs, attn_mask=bias)

        fwd_ours = median_seconds(lambda: ours(), args.reps, args.clock)
        fwd_peer = median_seconds(lambda: peer(), args.reps, args.clock)
        both_ours = median_seconds(lambda: torch.autograd.grad(ours(), inputs, dout), args.reps,
                                   args.clock)
        both_peer = median_seconds(lambda: torch.autograd.grad(peer(), peer_inputs, douts),
                                   args.reps, args.clock)
        print_row(name, (fwd_ours, fwd_peer, both_ours, both_peer), flops)


if __name__ == "__main__":
    main()
