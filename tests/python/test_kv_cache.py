"""fmha.attention_with_kvcache on CPU tensors: against fmha.attention of each sequence over exactly
its keys (bottom-right masks), paged == contiguous, the in-place append, packed queries, the custom
ops' fake kernels, and refusals."""

from __future__ import annotations

import pytest
import torch

import fmha
from fmha import _kv_cache_ops


def _make(lens, *, H=4, Hkv=2, D=16, Dv=12, Lq=1, page_size=0, dtype=torch.float64, seed=0):
    """Per-sequence keys/values, a cache holding them (contiguous, or shuffled pages), queries."""
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    keys = [torch.randn(n, Hkv, D, generator=g, dtype=dtype) for n in lens]
    values = [torch.randn(n, Hkv, Dv, generator=g, dtype=dtype) for n in lens]
    q = torch.randn(B, Lq, H, D, generator=g, dtype=dtype)
    cache = dict(cache_seqlens=torch.tensor(lens, dtype=torch.int32))
    if page_size == 0:
        cap = max(lens) + 2
        k_cache = torch.full((B, cap, Hkv, D), float("nan"), dtype=dtype)
        v_cache = torch.full((B, cap, Hkv, Dv), float("nan"), dtype=dtype)
        for b, n in enumerate(lens):
            k_cache[b, :n], v_cache[b, :n] = keys[b], values[b]
    else:
        used = [-(-n // page_size) for n in lens]
        pool = sum(used) + 1
        order = torch.randperm(pool, generator=g).tolist()
        max_pages = max(used) + 1
        table = torch.full((B, max_pages), -1, dtype=torch.int32)
        k_cache = torch.full((pool, page_size, Hkv, D), float("nan"), dtype=dtype)
        v_cache = torch.full((pool, page_size, Hkv, Dv), float("nan"), dtype=dtype)
        for b, n in enumerate(lens):
            for p in range(used[b]):
                page = order.pop()
                table[b, p] = page
                rows = slice(p * page_size, min(n, (p + 1) * page_size))
                count = rows.stop - rows.start
                k_cache[page, :count], v_cache[page, :count] = keys[b][rows], values[b][rows]
        cache["block_table"] = table
    return q, k_cache, v_cache, cache, keys, values


def _oracle(q, keys, values, **options):
    outs, lses = [], []
    for b in range(q.shape[0]):
        out, lse = fmha.attention(q[b : b + 1], keys[b][None], values[b][None],
                                  causal_alignment="bottom_right", return_lse=True, **options)  # fmt: skip
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


@pytest.mark.parametrize("page_size", [0, 1, 5, 16])
def test_decode_matches_dense_attention(page_size):
    q, k_cache, v_cache, cache, keys, values = _make([7, 0, 23, 16], page_size=page_size)
    out, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, causal=True, return_lse=True,
                                           **cache)  # fmt: skip
    ref_out, ref_lse = _oracle(q, keys, values, causal=True)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse.to(lse.dtype), rtol=1e-12, atol=1e-12)
    assert torch.all(out[1] == 0) and torch.all(lse[1] == float("-inf"))  # the empty cache


@pytest.mark.parametrize(
    "options",
    [
        dict(causal=True, window=(3, 0)),
        dict(window=(2, 1)),
        dict(causal=True, softcap=2.0, scale=0.5),
        dict(causal=True, sinks=True),
    ],
)
def test_short_queries_every_option(options):
    options = dict(options)
    q, k_cache, v_cache, cache, keys, values = _make([9, 3, 20], Lq=4, page_size=4, H=6, Hkv=3)
    if options.pop("sinks", False):
        options["sinks"] = torch.randn(6, dtype=torch.float64)
    out = fmha.attention_with_kvcache(q, k_cache, v_cache, **cache, **options)
    ref_out, _ = _oracle(q, keys, values, **options)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)


def test_paged_equals_contiguous_in_bf16():
    args = dict(H=8, Hkv=1, D=32, Dv=32, Lq=2, dtype=torch.bfloat16, seed=3)
    q, kc, vc, cache, *_ = _make([5, 31, 12], **args)
    qp, kp, vp, paged, *_ = _make([5, 31, 12], page_size=8, **args)
    out = fmha.attention_with_kvcache(q, kc, vc, causal=True, **cache)
    out_paged = fmha.attention_with_kvcache(qp, kp, vp, causal=True, **paged)
    assert torch.equal(out, out_paged)


@pytest.mark.parametrize("page_size", [0, 3])
def test_append_then_attend(page_size):
    lens = [6, 2, 11]
    q, k_cache, v_cache, cache, keys, values = _make([n + 2 for n in lens], Lq=2, page_size=page_size)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    k_new = torch.stack([keys[b][n:] for b, n in enumerate(lens)])
    v_new = torch.stack([values[b][n:] for b, n in enumerate(lens)])
    for b, n in enumerate(lens):  # forget the last two tokens: the append must write them back
        for t in (n, n + 1):
            if page_size:
                page = cache["block_table"][b, t // page_size]
                k_cache[page, t % page_size] = float("nan")
            else:
                k_cache[b, t] = float("nan")
    out = fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new, causal=True,
                                      block_table=cache.get("block_table"))  # fmt: skip
    assert seqlens.tolist() == lens  # not modified
    ref_out, _ = _oracle(q, keys, values, causal=True)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("option", [dict(causal="yes"), dict(return_lse="yes"), dict(scale="x"),
                                    dict(num_splits=2.0), dict(window=(1, "2"))])
def test_bad_option_raises_before_the_append(option):
    lens = [3, 5]
    q, k_cache, v_cache, cache, keys, values = _make([n + 1 for n in lens], page_size=2)
    before = (k_cache.clone(), v_cache.clone())
    k_new = torch.stack([keys[b][n:] for b, n in enumerate(lens)])
    v_new = torch.stack([values[b][n:] for b, n in enumerate(lens)]) + 1.0
    with pytest.raises((TypeError, ValueError), match="fmha: "):
        fmha.attention_with_kvcache(q, k_cache, v_cache, torch.tensor(lens, dtype=torch.int32),
                                    k_new, v_new, block_table=cache["block_table"], **option)  # fmt: skip
    # bitwise (the unused rows hold NaN)
    assert torch.equal(k_cache.view(torch.int64), before[0].view(torch.int64))
    assert torch.equal(v_cache.view(torch.int64), before[1].view(torch.int64))


def test_packed_queries():
    lens, q_lens = [9, 4, 0], [3, 1, 2]
    _, k_cache, v_cache, cache, keys, values = _make(lens, page_size=2)
    q = torch.randn(sum(q_lens), 4, 16, dtype=torch.float64)
    cu = torch.tensor([0, 3, 4, 6], dtype=torch.int32)
    out, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, cu_seqlens_q=cu, causal=True,
                                           return_lse=True, **cache)  # fmt: skip
    assert out.shape == (6, 4, 12) and lse.shape == (4, 6)
    for b in range(3):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        ref, ref_lse = _oracle(q[rows][None], keys[b : b + 1], values[b : b + 1], causal=True)
        torch.testing.assert_close(out[rows], ref[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[:, rows], ref_lse[0], rtol=1e-12, atol=1e-12)


def test_bad_block_table_is_refused():
    q, k_cache, v_cache, cache, *_ = _make([7, 5], page_size=4)
    cache["block_table"][1, 1] = 1000
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 1000"):
        fmha.attention_with_kvcache(q, k_cache, v_cache, **cache)
    with pytest.raises(ValueError, match="kBottomRight|not accepted|top"):
        # the C++ layer refuses a top-left mask over a cache; the Python function never passes one
        p = fmha._C.KvCacheForwardParams()
        p.options.causal = True
        fmha._bridge.raise_for_status(fmha._C.check(p))


def test_fake_kernels_and_opcheck():
    q, k_cache, v_cache, cache, *_ = _make([7, 5], page_size=4, Lq=2)
    args = (q, k_cache, v_cache, cache["cache_seqlens"], cache["block_table"], None, 0, None, 0.0,
            True, -1, -1, None, 0)  # fmt: skip
    torch.library.opcheck(_kv_cache_ops.kvcache_fwd, args,
                          test_utils=("test_schema", "test_faketensor"))  # fmt: skip
    compiled = torch.compile(fmha.attention_with_kvcache, fullgraph=True)
    out = compiled(q, k_cache, v_cache, cache["cache_seqlens"], block_table=cache["block_table"],
                   causal=True)  # fmt: skip
    torch.testing.assert_close(out, fmha.attention_with_kvcache(q, k_cache, v_cache, causal=True,
                                                                **cache))  # fmt: skip


_CUDA = pytest.mark.skipif(
    not (torch.cuda.is_available() and fmha.built_with_cuda()), reason="needs a CUDA build and device"
)


def _replays_the_same(call, expected):
    """call() captured into a CUDA graph (after a warm-up on a side stream) and replayed returns
    `expected` bit for bit."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        captured = call()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, expected)


@_CUDA
def test_cuda_matches_cpu_workspace_and_graph_capture():
    args = dict(H=8, Hkv=2, D=64, Dv=64, dtype=torch.bfloat16, seed=5)
    q, k_cache, v_cache, cache, *_ = _make([3000, 1, 70], page_size=16, **args)
    expected = fmha.attention_with_kvcache(q, k_cache, v_cache, causal=True, **cache)
    dev = {name: t.cuda() for name, t in cache.items()}
    q, k_cache, v_cache = q.cuda(), k_cache.cuda(), v_cache.cuda()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fmha.attention_with_kvcache(q, k_cache, v_cache, causal=True, **dev)
    torch.cuda.synchronize()
    # The split-KV workspace came from torch's allocator: the peak holds it beside the output.
    assert torch.cuda.max_memory_allocated() - before > out.numel() * out.element_size()
    torch.testing.assert_close(out.cpu().float(), expected.float(), rtol=2e-2, atol=2e-2)

    _replays_the_same(lambda: fmha.attention_with_kvcache(q, k_cache, v_cache, causal=True, **dev), out)


@_CUDA
@pytest.mark.parametrize("page_size", [0, 16, 64])
def test_cuda_prefill_matches_cpu_and_captures(page_size):
    """Prefill-sized calls (200 queries a sequence; on Hopper the dense forward reads the cache)
    against the CPU path, out and lse, and the same result under CUDA-graph capture."""
    args = dict(H=8, Hkv=2, D=64, Dv=64, Lq=200, dtype=torch.bfloat16, seed=9)
    q, k_cache, v_cache, cache, *_ = _make([900, 200, 333], page_size=page_size, **args)
    expected, expected_lse = fmha.attention_with_kvcache(q, k_cache, v_cache, causal=True,
                                                         return_lse=True, **cache)  # fmt: skip
    dev = {name: t.cuda() for name, t in cache.items()}
    q, k_cache, v_cache = q.cuda(), k_cache.cuda(), v_cache.cuda()
    out, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, causal=True, return_lse=True, **dev)
    torch.testing.assert_close(out.cpu().float(), expected.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse.cpu(), expected_lse, rtol=1e-3, atol=1e-3)

    _replays_the_same(lambda: fmha.attention_with_kvcache(q, k_cache, v_cache, causal=True, **dev), out)
