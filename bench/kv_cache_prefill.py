"""Prefill over a KV cache: Lq new queries attending causally (bottom-right) over a cache of L keys
that already holds their own keys, through fmha.attention_with_kvcache (contiguous and paged),
against fmha's dense forward on the same q, k and v (fmha.attention with causal_alignment
'bottom_right'), which is what the cache path should approach (issue 33: within 10% of the dense
forward's TFLOP/s at the same visible FLOPs). One process, CUDA events, the L2 flushed before every
run (fmha.bench's Timer), random normal bf16 inputs; FLOPs count visible (query, key) pairs only:
4 * pairs * D. Each cache run's output is compared with the dense forward's.

    python bench/kv_cache_prefill.py                     # GQA 32/8, D 128, Lq 1k-8k over L 8k-64k
    python bench/kv_cache_prefill.py --page-size 16
    python bench/kv_cache_prefill.py --cases 8,64,8192 --cases 8,128,8192   # B,Lq,L of your own

FMHA_KV_CACHE_KERNEL=tensor-cores (or forward) in the environment forces the cache path's kernel.
"""
from __future__ import annotations

import argparse
import sys

import torch

import fmha
from fmha.bench.timing import Timer, TimerSettings

CASES = [  # (B, Lq, L)
    (1, 1024, 8192), (1, 4096, 8192), (1, 8192, 8192), (1, 1024, 65536), (1, 4096, 32768),
    (4, 1024, 16384),
]


def visible_pairs(lq: int, lk: int) -> int:
    """Pairs a bottom-right causal mask shows: query i (of lq <= lk) sees the first lk - lq + i + 1
    keys."""
    return lq * (lk - lq) + lq * (lq + 1) // 2


def paged(cache: torch.Tensor, page_size: int, generator: torch.Generator):
    """[B, L, Hkv, D] as pages [B * L / page_size, page_size, Hkv, D] in a random order, with the
    block table that finds them."""
    b, length = cache.shape[:2]
    per_seq = length // page_size
    order = torch.randperm(b * per_seq, generator=generator).to(cache.device)
    pages = torch.empty((b * per_seq, page_size) + tuple(cache.shape[2:]), dtype=cache.dtype,
                        device=cache.device)
    pages[order] = cache.reshape((b * per_seq, page_size) + tuple(cache.shape[2:]))
    return pages, order.reshape(b, per_seq).to(torch.int32)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default="32,8", help="H,Hkv")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--budget-ms", type=float, default=40.0)
    parser.add_argument("--cases", action="append", default=None, metavar="B,LQ,L",
                        help="a case of its own (repeatable); default: the built-in list")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kv_cache_prefill: needs a CUDA device")
        return 1
    heads, kv_heads = (int(x) for x in args.heads.split(","))
    dim = args.dim
    timer = Timer("cuda", TimerSettings(budget_ms=args.budget_ms))
    generator = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, H {heads} / Hkv {kv_heads},"
          f" D {dim}, pages of {args.page_size}; TFLOP/s over visible pairs, median ms")
    print("| B | Lq | L | dense ms | dense TFLOP/s | cache ms | cache TFLOP/s | x dense | paged ms |"
          " paged TFLOP/s | x dense | max diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    cases = [tuple(int(x) for x in c.split(",")) for c in args.cases] if args.cases else CASES
    for b, lq, length in cases:
        opts = dict(dtype=torch.bfloat16, device="cuda")
        q = torch.randn(b, lq, heads, dim, **opts)
        k = torch.randn(b, length, kv_heads, dim, **opts)
        v = torch.randn(b, length, kv_heads, dim, **opts)
        flops = 4.0 * b * heads * visible_pairs(lq, length) * dim
        seqlens = torch.full((b,), length, dtype=torch.int32, device="cuda")
        k_pages, table = paged(k, args.page_size, generator)
        v_pages = torch.empty_like(k_pages)
        v_pages[table.reshape(-1).long()] = v.reshape(k_pages.shape)

        def dense(_):
            return fmha.attention(q, k, v, causal=True, causal_alignment="bottom_right")

        def cache(_):
            return fmha.attention_with_kvcache(q, k, v, seqlens, causal=True)

        def cache_paged(_):
            return fmha.attention_with_kvcache(q, k_pages, v_pages, seqlens, block_table=table,
                                               causal=True)

        reference = dense(0).float()
        diff = max((f(0).float() - reference).abs().max().item() for f in (cache, cache_paged))
        times = [timer.measure(f)["median_ms"] for f in (dense, cache, cache_paged)]
        rates = [flops / (t * 1e9) for t in times]
        print(f"| {b} | {lq} | {length} | {times[0]:.3f} | {rates[0]:.0f} | {times[1]:.3f} |"
              f" {rates[1]:.0f} | {times[0] / times[1]:.2f}x | {times[2]:.3f} | {rates[2]:.0f} |"
              f" {times[0] / times[2]:.2f}x | {diff:.1e} |", flush=True)
        del q, k, v, k_pages, v_pages
    return 0


if __name__ == "__main__":
    sys.exit(main())
