"""Decode over a KV cache (one query token a sequence): fmha.attention_with_kvcache on a paged and a
contiguous cache against PyTorch SDPA (cuDNN and flash backends, GQA without copies) on the same
keys, timed in one process. Reports milliseconds and the cache bytes read per second (K and V of
every sequence, the bound a decode kernel works against) next to the card's measured copy bandwidth.

    python bench/kv_cache_decode.py                   # the issue-33 grid that fits the card
    python bench/kv_cache_decode.py --quick           # a few cases
    python bench/kv_cache_decode.py --page-sizes 16,64,256

CUDA only (a CPU run times the float64 reference: use --smoke there, which only exercises the
script).
"""
from __future__ import annotations

import argparse
import itertools
import statistics

import torch
import torch.nn.functional as F

import fmha


def time_ms(fn, device: str, repeats: int) -> float:
    """Median of `repeats` calls, each timed alone by CUDA events after warm-up calls."""
    for _ in range(3):
        fn()
    if device != "cuda":
        import time

        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def copy_bandwidth(device: str) -> float:
    """Bytes a second of a 1 GiB device-to-device copy (read + write), the card's practical bound."""
    if device != "cuda":
        return float("nan")
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, 20)
    return 2 * src.numel() / (ms * 1e-3)


def paged_copies(k: torch.Tensor, v: torch.Tensor, page_size: int, generator: torch.Generator):
    """k, v [B, L, Hkv, *] as shuffled pages [B * L / page_size, page_size, Hkv, *] + block table."""
    B, L, Hkv, _ = k.shape
    per_seq = L // page_size
    order = torch.randperm(B * per_seq, generator=generator).to(k.device)

    def scatter(t: torch.Tensor) -> torch.Tensor:
        pages = torch.empty(B * per_seq, page_size, Hkv, t.shape[-1], dtype=t.dtype, device=t.device)
        pages[order] = t.reshape(B * per_seq, page_size, Hkv, t.shape[-1])
        return pages

    return scatter(k), scatter(v), order.view(B, per_seq).to(torch.int32)


def run_case(B, L, H, Hkv, D, page_sizes, device, dtype, repeats, bandwidth):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, 1, H, D, generator=g).to(device, dtype)
    k = torch.randn(B, L, Hkv, D, generator=g).to(device, dtype)
    v = torch.randn(B, L, Hkv, D, generator=g).to(device, dtype)
    seqlens = torch.full((B,), L, dtype=torch.int32, device=device)
    cache_bytes = 2 * k.numel() * k.element_size()
    rows = []

    def add(name, fn):
        try:
            ms = time_ms(fn, device, repeats)
        except (RuntimeError, NotImplementedError, ValueError) as e:
            rows.append((name, None, str(e).splitlines()[0][:60]))
            return
        rows.append((name, ms, ""))

    add("fmha contiguous", lambda: fmha.attention_with_kvcache(q, k, v, seqlens))
    expected = F.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
        enable_gqa=Hkv != H).transpose(1, 2)  # fmt: skip
    errors = {}
    try:
        errors["contiguous"] = (fmha.attention_with_kvcache(q, k, v, seqlens).float() - expected).abs().max().item()
    except (RuntimeError, NotImplementedError, ValueError):
        pass
    for page_size in page_sizes:
        if L % page_size:
            continue
        k_pages, v_pages, table = paged_copies(k, v, page_size, g)
        add(f"fmha paged {page_size}",
            lambda kp=k_pages, vp=v_pages, t=table: fmha.attention_with_kvcache(
                q, kp, vp, seqlens, block_table=t))  # fmt: skip
        try:
            out = fmha.attention_with_kvcache(q, k_pages, v_pages, seqlens, block_table=table)
            errors[f"paged {page_size}"] = (out.float() - expected).abs().max().item()
        except (RuntimeError, NotImplementedError, ValueError):
            pass
        del k_pages, v_pages
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if device == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, backend in (("sdpa cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa flash", SDPBackend.FLASH_ATTENTION)):  # fmt: skip
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=Hkv != H)

            add(name, sdpa)
    print(f"B {B} L {L} H {H}/{Hkv} D {D}: cache {cache_bytes / 2**30:.2f} GiB; max |fmha - fp32 SDPA|: "
          + ", ".join(f"{name} {err:.1e}" for name, err in errors.items()))
    for name, ms, note in rows:
        if ms is None:
            print(f"  {name:18s} refused: {note}")
            continue
        rate = cache_bytes / (ms * 1e-3)
        share = f" = {rate / bandwidth:.0%} of copy" if bandwidth == bandwidth else ""
        print(f"  {name:18s} {ms:8.3f} ms  {rate / 1e12:6.2f} TB/s{share}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few cases")
    parser.add_argument("--smoke", action="store_true", help="tiny cases, any device (checks the script)")
    parser.add_argument("--page-sizes", default="16,64,256")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--max-cache-gib", type=float, default=8.0,
                        help="skip cases whose K + V exceed this (each layout holds a copy)")  # fmt: skip
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    page_sizes = [int(p) for p in args.page_sizes.split(",")]
    if args.smoke:
        grid = [(2, 256, 8, 2, 64)]
        page_sizes = [16]
    elif device != "cuda":
        raise SystemExit("kv_cache_decode.py times CUDA kernels; use --smoke on a CPU-only machine")
    elif args.quick:
        grid = [(1, 131072, 32, 8, 128), (8, 32768, 32, 8, 128), (64, 4096, 32, 8, 128)]
    else:
        heads = [(32, 8), (32, 32), (32, 1)]
        grid = [(B, L, H, Hkv, D) for (B, L), (H, Hkv), D in itertools.product(
            itertools.product((1, 8, 64), (4096, 32768, 131072)), heads, (64, 128, 256))]  # fmt: skip
    bandwidth = copy_bandwidth(device)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"kv_cache_decode on {name}, torch {torch.__version__}, fmha {fmha.__version__}, {dtype}")
    if bandwidth == bandwidth:
        print(f"copy bandwidth (1 GiB device-to-device, read + write): {bandwidth / 1e12:.2f} TB/s")
    for B, L, H, Hkv, D in grid:
        cache_gib = 2 * B * L * Hkv * D * 2 / 2**30
        if cache_gib > args.max_cache_gib:
            print(f"B {B} L {L} H {H}/{Hkv} D {D}: skipped, cache {cache_gib:.1f} GiB > --max-cache-gib")
            continue
        run_case(B, L, H, Hkv, D, page_sizes, device, dtype, args.repeats if not args.smoke else 3,
                 bandwidth)  # fmt: skip
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
