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

import argparse
import re
import statistics
import time

import torch
import torch.nn.functional as F

import fmha

# (name, kind, B, H, key grid (rows, cols) for rel-pos or L for a bias, D)
CASES = [
    ("SAM rel-pos 32x32 H8 D64", "relpos", 1, 8, (32, 32), 64),
    ("SAM rel-pos 64x64 H2 D64", "relpos", 1, 2, (64, 64), 64),
    ("bias [1,H,L,L] L1024 H8 D64", "bias", 1, 8, 1024, 64),
    ("bias [1,H,L,L] L2048 H4 D64", "bias", 1, 4, 2048, 64),
]

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
    print("| case | fmha fwd ms | SDPA+bias fwd ms | fwd ratio | fmha fwd+bwd ms | "
          "SDPA+bias fwd+bwd ms | fwd+bwd ratio | fmha GFLOP/s fwd |")
    print("|---|---|---|---|---|---|---|---|")
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

        fwd_ours = median_seconds(lambda: ours(), args.reps)
        fwd_peer = median_seconds(lambda: peer(), args.reps)
        both_ours = median_seconds(lambda: torch.autograd.grad(ours(), inputs, dout), args.reps)
        both_peer = median_seconds(lambda: torch.autograd.grad(peer(), peer_inputs, douts),
                                   args.reps)
        print(f"| {name} | {fwd_ours * 1e3:.2f} | {fwd_peer * 1e3:.2f} | {fwd_peer / fwd_ours:.1f}x | "
              f"{both_ours * 1e3:.2f} | {both_peer * 1e3:.2f} | {both_peer / both_ours:.1f}x | "
              f"{flops / fwd_ours * 1e-9:.0f} |", flush=True)


if __name__ == "__main__":
    main()
