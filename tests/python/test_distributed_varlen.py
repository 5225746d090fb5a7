"""fmha.distributed.attention_varlen (SPEC §8, §17): packed documents sharded over 2 and 4 CPU
processes (gloo) against single-process fmha.attention_varlen on the whole packed batch: out, lse
and every gradient, for both forms, both layouts, causal (both alignments, Lq != Lk per document)
and not, windows, GQA/MQA, softcap, sinks, documents shorter than 2W (some ranks hold nothing of
them), of one token and of none, and documents that cross shard boundaries.

It follows tests/python/test_distributed.py: one group of processes per world size runs every case
and reports per case the norm-wise relative error of each result; FMHA_DISTRIBUTED_DEVICE=cuda runs
the same cases over NCCL, one GPU a rank (the float64 cases skip there).

    FMHA_DISTRIBUTED_DEVICE=cuda python -m pytest -q tests/python/test_distributed_varlen.py"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import fmha
from attention_reference import attention as naive_attention
from attention_reference import sequence_mask
from distributed_group import (DEVICE, LOW_PRECISION, MARKS, TOLERANCE, WORLDS,
                               check_all_true, check_case, entries, rel_error)  # fmt: skip

cp = pytest.importorskip("fmha.distributed", reason="the installed fmha has no fmha.distributed")
pytestmark = MARKS

# Document lengths. 1 and 3 are shorter than 2W on 2 and 4 ranks (zigzag leaves ranks without a
# row of them), 0 is an empty document; the longer ones are odd and unequal.
SAME = [13, 1, 3, 0, 22, 7]
# Keys per document for Lq != Lk: longer and shorter than the queries, none for one document.
OTHER = [17, 2, 1, 4, 15, 0]
LONG = [150, 1, 137, 3]  # the direct backward needs calls of more than one key tile (64 keys)


def _uneven(total: int, world: int) -> list[int]:
    """Contiguous shard lengths with an empty first shard, the rest growing with the rank."""
    weights = [0] + [r + 1 for r in range(world - 1)]
    lens = [total * w // sum(weights) for w in weights]
    lens[-1] += total - sum(lens)
    return lens


# name: options of the case. Defaults: H 4, Hkv 4, D 8, fp32, documents SAME (q and k), zigzag,
# ring, lse returned.
CASES = {
    "plain-zigzag-ring": dict(),
    "plain-contiguous-allgather": dict(layout="contiguous", form="allgather", kdocs=OTHER),
    "causal-zigzag-ring": dict(causal=True),
    "causal-zigzag-allgather": dict(causal=True, form="allgather", H=4, Hkv=2),
    "causal-contiguous-ring": dict(causal=True, layout="contiguous"),
    "causal-contiguous-allgather": dict(causal=True, layout="contiguous", form="allgather"),
    "causal-top-left-lq-ne-lk-ring": dict(causal=True, kdocs=OTHER, layout="contiguous"),
    "causal-bottom-right-zigzag-ring": dict(causal=True, align="bottom_right", kdocs=OTHER),
    "causal-bottom-right-allgather": dict(causal=True, align="bottom_right", kdocs=OTHER,
                                          form="allgather", layout="contiguous"),
    "window-bottom-right-zigzag": dict(window=(3, 2), align="bottom_right", kdocs=OTHER),
    "window-causal-contiguous-allgather": dict(window=(4, -1), causal=True, layout="contiguous",
                                               form="allgather"),
    "window-left-unbounded-ring": dict(window=(-1, 1), layout="contiguous"),
    "gqa-window-allgather": dict(H=4, Hkv=2, window=(2, 5), form="allgather"),
    "mqa-causal-uneven-ring": dict(H=4, Hkv=1, causal=True, layout="contiguous", lengths=_uneven),
    "uneven-allgather": dict(causal=True, align="bottom_right", kdocs=OTHER, layout="contiguous",
                             form="allgather", lengths=_uneven),
    "softcap-sinks-ring": dict(softcap=3.0, sinks=True, causal=True, kdocs=OTHER),
    "sinks-allgather-contiguous": dict(sinks=True, window=(2, 2), kdocs=OTHER, form="allgather",
                                       layout="contiguous"),
    "dv-differs-scale": dict(D=8, Dv=12, scale=0.6, causal=True),
    "strided-inputs-ring": dict(strided=True, causal=True, H=4, Hkv=2),
    "strided-inputs-allgather": dict(strided=True, window=(3, 0), layout="contiguous",
                                     form="allgather"),
    "float64-ring": dict(dtype=torch.float64, causal=True, align="bottom_right", kdocs=OTHER,
                         sinks=True, softcap=2.0, H=4, Hkv=2),
    "float64-allgather": dict(dtype=torch.float64, window=(3, 1), form="allgather",
                              layout="contiguous"),
    "bfloat16-allgather": dict(dtype=torch.bfloat16, causal=True, form="allgather", H=4, Hkv=2,
                               qdocs=[29, 1, 3, 40], kdocs=[29, 1, 3, 40], sinks=True),
    "float16-ring": dict(dtype=torch.float16, window=(5, 0), layout="contiguous",
                         qdocs=[33, 2, 27], kdocs=[33, 2, 27]),
    "auto-form-no-lse": dict(form="auto", causal=True, lse=False),
    # The backward CUDA takes (every call's backward gets the merged out and lse), on the fast CPU
    # backend, which reads Delta from the given out only for a sequence of more than one key tile
    # (64 keys): every sequence of these calls is longer, or holds all the keys of its rows (the
    # all-gather's, and the short documents').
    "direct-backward-zigzag-allgather": dict(backward="direct", causal=True, form="allgather",
                                             qdocs=LONG, kdocs=LONG, H=2),
    "direct-backward-contiguous-allgather": dict(backward="direct", window=(100, 0), qdocs=LONG,
                                                 kdocs=LONG, H=2, layout="contiguous",
                                                 form="allgather"),
    "direct-backward-zigzag-ring": dict(backward="direct", causal=True, H=2,
                                        qdocs=lambda w: [140 * w, 133 * w + 1]),
}


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def _leaves(q, k, v, sinks):
    return [t.clone().requires_grad_() for t in (q, k, v)], (
        None if sinks is None else sinks.clone().requires_grad_()
    )


def _results(out, lse, inputs, sinks, want_lse) -> dict:
    results = dict(out=out.detach(), dq=inputs[0].grad, dk=inputs[1].grad, dv=inputs[2].grad)
    if want_lse:
        results["lse"] = lse.detach()
    if sinks is not None:
        results["dsinks"] = sinks.grad
    return results


def _backward(out, lse, dout, dlse, want_lse) -> None:
    torch.autograd.backward([out, lse] if want_lse else [out], [dout, dlse] if want_lse else [dout])


def _single_process(q, k, v, sinks, cu_q, cu_k, dout, dlse, opts, want_lse) -> dict:
    """fmha.attention_varlen on the whole packed batch: every result and gradient."""
    inputs, sinks = _leaves(q, k, v, sinks)
    max_q, max_k = int((cu_q[1:] - cu_q[:-1]).max()), int((cu_k[1:] - cu_k[:-1]).max())
    out, lse = fmha.attention_varlen(*inputs, cu_q, cu_k, max_q, max_k, sinks=sinks,
                                     return_lse=True, **opts)  # fmt: skip
    _backward(out, lse, dout, dlse, want_lse)
    return _results(out, lse, inputs, sinks, want_lse)


def _naive(q, k, v, sinks, cu_q, cu_k, dout, dlse, opts, want_lse) -> dict:
    """The naive implementation in q's dtype, document by document (what SPEC §13 measures fp16 /
    bf16 results against); its cases have no empty document."""
    inputs, sinks = _leaves(q, k, v, sinks)
    outs, lses = [], []
    for qa, qb, ka, kb in zip(cu_q.tolist(), cu_q[1:].tolist(), cu_k.tolist(), cu_k[1:].tolist()):
        mask = sequence_mask(qb - qa, kb - ka, causal=opts["causal"],
                             alignment=opts["causal_alignment"], window=opts["window"])  # fmt: skip
        out, lse = naive_attention(*(t[a:b].unsqueeze(0) for t, a, b in
                                     zip(inputs, (qa, ka, ka), (qb, kb, kb))),
                                   scale=opts["scale"], softcap=opts["softcap"], mask=mask,
                                   sinks=sinks)  # fmt: skip
        outs.append(out[0])
        lses.append(lse[0])
    out, lse = torch.cat(outs), torch.cat(lses, 1)
    _backward(out, lse, dout, dlse.to(lse.dtype), want_lse)
    return _results(out, lse, inputs, sinks, want_lse)


def _run_case(spec: dict, world: int) -> dict:
    if DEVICE != "cpu" and spec.get("dtype") == torch.float64:
        return {"skipped": f"float64 runs on the CPU only, not on {DEVICE}"}
    g = torch.Generator().manual_seed(len(spec) * 7919 + world)
    H, Hkv = spec.get("H", 4), spec.get("Hkv", spec.get("H", 4))
    D = spec.get("D", 8)
    Dv, dtype = spec.get("Dv", D), spec.get("dtype", torch.float32)
    layout, form = spec.get("layout", "zigzag"), spec.get("form", "ring")
    want_lse = spec.get("lse", True)
    opts = dict(causal=spec.get("causal", False), causal_alignment=spec.get("align", "top_left"),
                window=spec.get("window"), softcap=spec.get("softcap", 0.0),
                scale=spec.get("scale"))  # fmt: skip
    qdocs = spec.get("qdocs", SAME)
    qdocs = qdocs(world) if callable(qdocs) else qdocs
    cu_q, cu_k = _cu(qdocs), _cu(spec.get("kdocs", qdocs))
    Tq, Tk = int(cu_q[-1]), int(cu_k[-1])
    q = torch.randn(Tq, H, D, generator=g).to(dtype)
    k = torch.randn(Tk, Hkv, D, generator=g).to(dtype)
    v = torch.randn(Tk, Hkv, Dv, generator=g).to(dtype)
    dout = torch.randn(Tq, H, Dv, generator=g).to(dtype)
    stats_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    dlse = torch.randn(H, Tq, generator=g, dtype=stats_dtype)
    sinks = torch.randn(H, generator=g) if spec.get("sinks") else None

    if dtype in LOW_PRECISION:  # SPEC §13: 2 x a naive same-dtype implementation's error + 1e-4
        wide = [t.double() for t in (q, k, v)]
        reference = _single_process(*wide, sinks, cu_q, cu_k, dout.double(), dlse.double(), opts,
                                    want_lse)  # fmt: skip
        naive = _naive(q, k, v, sinks, cu_q, cu_k, dout, dlse, opts, want_lse)
        tolerance = {n: 2 * rel_error(naive[n], reference[n]) + 1e-4 for n in reference}
    else:
        reference = _single_process(q, k, v, sinks, cu_q, cu_k, dout, dlse, opts, want_lse)
        tolerance = {n: TOLERANCE[dtype] for n in reference}
    tolerance["dsinks"] = max(tolerance.get("dsinks", 0.0), TOLERANCE[torch.float32])

    lengths = spec.get("lengths")
    q_lens, k_lens = (lengths(Tq, world), lengths(Tk, world)) if lengths else (None, None)
    mine = [cp.shard_varlen(t.to(DEVICE), cu, layout=layout, lengths=n)
            for t, cu, n in ((q, cu_q, q_lens), (k, cu_k, k_lens), (v, cu_k, k_lens))]  # fmt: skip
    if spec.get("strided"):  # [H, L, D] storage seen as [L, H, D]
        mine = [t.transpose(0, 1).contiguous().transpose(0, 1) for t in mine]
    mine = [t.detach().requires_grad_() for t in mine]
    shard_sinks = sinks.to(DEVICE).requires_grad_() if sinks is not None else None
    modes = dict(cp._BACKWARD_MODE)
    if "backward" in spec:
        cp._BACKWARD_MODE[DEVICE] = spec["backward"]
    try:
        max_k = int((cu_k[1:] - cu_k[:-1]).max())
        result = cp.attention_varlen(*mine, cu_q, cu_k, max(qdocs), max_k, layout=layout,
                                     form=form, sinks=shard_sinks, return_lse=want_lse,
                                     **opts)  # fmt: skip
    finally:
        cp._BACKWARD_MODE.clear()
        cp._BACKWARD_MODE.update(modes)
    out, lse = result if want_lse else (result, None)
    local_dout = cp.shard_varlen(dout.to(DEVICE), cu_q, layout=layout, lengths=q_lens)
    local_dlse = cp.shard_varlen(dlse.to(DEVICE), cu_q, layout=layout, lengths=q_lens, dim=1)
    _backward(out, lse, local_dout, local_dlse, want_lse)

    def whole(x, cu, dim=0):
        return cp.unshard_varlen(x.detach(), cu, layout=layout, dim=dim).cpu()

    got = dict(out=whole(out, cu_q), dq=whole(mine[0].grad, cu_q), dk=whole(mine[1].grad, cu_k),
               dv=whole(mine[2].grad, cu_k))  # fmt: skip
    if want_lse:
        got["lse"] = whole(lse, cu_q, dim=1)
    if sinks is not None:
        dsinks = shard_sinks.grad.clone()
        dist.all_reduce(dsinks)  # each rank holds its queries' part
        got["dsinks"] = dsinks.cpu()
    errors = {n: rel_error(got[n], reference[n]) for n in got}
    # This rank's out against its own shard of the single-process one.
    local_ref = cp.shard_varlen(reference["out"], cu_q, layout=layout, lengths=q_lens)
    errors["out-local"] = rel_error(out.cpu(), local_ref)
    tolerance["out-local"] = tolerance["out"]
    return {"errors": errors, "tolerance": tolerance}


def _run_refusals(world: int) -> dict:
    """Calls that must be refused on every rank, with the exception type each raised."""
    x = torch.randn(6, 2, 4, device=DEVICE)
    cu = [0, 2, 6]
    mine = cp.shard_varlen(x, cu, layout="zigzag")

    def call(*args, q=mine, **kwargs):
        return cp.attention_varlen(q, mine, mine, *args, layout="zigzag", **kwargs)

    raised = {}
    for name, run in (
        ("bias", lambda: call(cu, cu, 4, 4, bias=torch.zeros(1, device=DEVICE))),
        ("rel-pos", lambda: call(cu, cu, 4, 4, rel_pos=(x, x))),
        ("extra-kv", lambda: call(cu, cu, 4, 4, extra_kv=(x[None], x[None]))),
        ("bad-form", lambda: call(cu, cu, 4, 4, form="p2p")),
        ("dense-q", lambda: call(cu, cu, 4, 4, q=mine[None])),
        ("cu-descending", lambda: call([0, 4, 2, 6], cu, 4, 4)),
        ("cu-counts", lambda: call(cu, [0, 6], 4, 6)),
        ("max-seqlen", lambda: call(cu, cu, 3, 4)),
        ("rows", lambda: call([0, 2, 7], [0, 2, 7], 5, 5)),
        ("zigzag-lengths", lambda: cp.varlen_segments(cu, world, "zigzag", lengths=[3, 3])),
    ):  # fmt: skip
        try:
            run()
            raised[name] = None
        except Exception as e:  # noqa: BLE001 (the type is the result)
            raised[name] = type(e).__name__
    return raised


def _run_helpers(world: int) -> dict:
    """The shard helpers and the call's variants that must agree exactly: name -> bool."""
    rank = dist.get_rank()
    checks = {}
    g = torch.Generator().manual_seed(3)
    for docs in ([5, 0, 1, 12, 3], [0], [2 * world + 1]):
        cu = _cu(docs)
        doc_of_row = torch.repeat_interleave(torch.arange(len(docs)), torch.tensor(docs))
        position = torch.cat([torch.arange(n) for n in docs])
        x = torch.randn(3, int(cu[-1]), 2, generator=g).to(DEVICE)
        for layout in cp.LAYOUTS:
            tag = f"{layout}-{docs}"
            mine = cp.shard_varlen(x, cu, layout=layout, dim=1)
            whole = cp.unshard_varlen(mine, cu, layout=layout, dim=1)
            checks[f"unshard-{tag}"] = torch.equal(whole, x)
            positions = cp.shard_positions_varlen(cu, layout=layout)
            want = cp.shard_varlen(position, cu, layout=layout)
            checks[f"positions-{tag}"] = torch.equal(positions, want)
            # The local offsets: document b's rows of the shard are rows local[b]..local[b+1]-1.
            local = cp.shard_cu_seqlens(cu, layout=layout).long()
            mine_docs = cp.shard_varlen(doc_of_row, cu, layout=layout)
            want = torch.repeat_interleave(torch.arange(len(docs)), local[1:] - local[:-1])
            checks[f"cu-seqlens-{tag}"] = torch.equal(mine_docs, want) and int(local[0]) == 0
            segs = cp.varlen_segments(cu, world, layout)[rank]
            checks[f"segments-{tag}"] = sum(n for _, n in segs) == mine.shape[1]
    # Documents of 8W and 4W rows, zigzag: chunks of 4 and 2 rows; rank r holds chunks r and
    # 2W-1-r of each, in document order.
    cu = _cu([8 * world, 4 * world])
    checks["zigzag-chunks"] = cp.varlen_segments(cu, world, "zigzag")[rank] == [
        (4 * rank, 4), (4 * (2 * world - 1 - rank), 4),
        (8 * world + 2 * rank, 2), (8 * world + 2 * (2 * world - 1 - rank), 2)]  # fmt: skip

    # deterministic=True: bitwise the same results and gradients on a second run; no-grad path.
    cu = _cu(SAME)
    full = [torch.randn(int(cu[-1]), 4, 8, generator=g).to(DEVICE) for _ in range(3)]
    q, k, v = (cp.shard_varlen(t, cu, layout="zigzag") for t in full)
    runs = []
    for _ in range(2):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        for form in ("ring", "allgather"):
            out = cp.attention_varlen(*leaves, cu, cu, 22, 22, causal=True, layout="zigzag",
                                      form=form, deterministic=True)  # fmt: skip
            out.backward(torch.ones_like(out))
        runs.append([out.detach()] + [t.grad for t in leaves])
    checks["deterministic"] = all(torch.equal(a, b) for a, b in zip(*runs))
    with torch.no_grad():
        c = cp.attention_varlen(q.requires_grad_(), k, v, cu, cu, 22, 22, causal=True,
                                layout="zigzag", form="allgather")  # fmt: skip
    d = cp.attention_varlen(q, k, v, cu, cu, 22, 22, causal=True, layout="zigzag",
                            form="allgather")  # fmt: skip
    checks["no-grad-path"] = torch.equal(c, d.detach()) and not c.requires_grad and d.requires_grad
    # lengths given (from the layout) instead of learned: the same call.
    every = [sum(n for _, n in segs) for segs in cp.varlen_segments(cu, world, "zigzag")]
    e = cp.attention_varlen(q, k, v, cu, cu, 22, 22, causal=True, layout="zigzag",
                            form="allgather", lengths=(every, every))  # fmt: skip
    checks["explicit-lengths"] = torch.equal(d, e)
    return checks


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_single_process(world: int, case: str) -> None:
    check_case(world, case, __name__, {"out", "out-local", "dq", "dk", "dv"})


@pytest.mark.parametrize("world", WORLDS)
def test_refusals(world: int) -> None:
    for _, refusals in entries(world, "refusals", __name__):
        assert refusals == {
            "bias": "NotImplementedError",
            "rel-pos": "NotImplementedError",
            "extra-kv": "NotImplementedError",
            "bad-form": "ValueError",
            "dense-q": "ValueError",
            "cu-descending": "ValueError",
            "cu-counts": "ValueError",
            "max-seqlen": "ValueError",
            "rows": "ValueError",
            "zigzag-lengths": "ValueError",
        }


@pytest.mark.parametrize("world", WORLDS)
def test_shard_helpers_and_call_variants(world: int) -> None:
    check_all_true(world, "helpers", __name__, 20)


# ---- Without processes ---------------------------------------------------------------------------

V = pytest.importorskip("fmha._distributed_varlen")


def test_varlen_segments() -> None:
    # Documents of 5, 0 and 9 rows on 2 ranks, zigzag: 4 chunks of each (2, 1, 1, 1 and
    # 3, 2, 2, 2); rank 0 holds chunks 0 and 3 of each document, rank 1 chunks 1 and 2.
    assert cp.varlen_segments([0, 5, 5, 14], 2, "zigzag") == [
        [(0, 2), (4, 1), (5, 0), (5, 0), (5, 3), (12, 2)],
        [(2, 1), (3, 1), (5, 0), (5, 0), (8, 2), (10, 2)],
    ]
    # contiguous: the packed rows as one sequence; documents cross the boundary.
    assert cp.varlen_segments([0, 5, 5, 14], 2, "contiguous") == [[(0, 7)], [(7, 7)]]
    assert cp.varlen_segments([0, 5, 14], 2, "contiguous", lengths=[0, 14]) == [[(0, 0)], [(0, 14)]]
    for world in (1, 2, 3, 4):
        for docs in ([0], [1], [7, 0, 1, 16], [3, 3, 33]):
            cu = _cu(docs).tolist()
            for layout in cp.LAYOUTS:
                segs = cp.varlen_segments(cu, world, layout)
                rows = [i for rank in segs for s, n in rank for i in range(s, s + n)]
                assert sorted(rows) == list(range(cu[-1]))
    with pytest.raises(ValueError, match="lengths"):
        cp.varlen_segments([0, 4], 2, "zigzag", lengths=[2, 2])
    with pytest.raises(ValueError, match="ascending"):
        cp.varlen_segments([0, 4, 3], 2, "zigzag")
    with pytest.raises(ValueError, match="layout"):
        cp.varlen_segments([0, 4], 2, "striped")


def test_doc_pieces() -> None:
    # Rows 3..9 of documents [0, 4), [4, 4) (empty), [4, 12): cut at 4; then rows 0..1.
    assert V._doc_pieces([(3, 6), (0, 2)], [0, 4, 4, 12]) == [
        (0, 3, 1, 0), (2, 0, 5, 1), (0, 0, 2, 6)]  # fmt: skip


def _mask_coverage(qdocs, kdocs, world, layout, left, right, bottom_right) -> int:
    """Checks that every rank's calls against every K/V buffer it may hold (each rank's shard, the
    gathered whole) see each visible (query, key) pair of the packed batch exactly once and no other
    pair; returns the number of calls made."""
    cu_q, cu_k = _cu(qdocs).tolist(), _cu(kdocs).tolist()
    q_segs, k_segs = (cp.varlen_segments(cu, world, layout) for cu in (cu_q, cu_k))
    diag = [(kb - ka) - (qb - qa) if bottom_right else 0
            for qa, qb, ka, kb in zip(cu_q, cu_q[1:], cu_k, cu_k[1:])]  # fmt: skip
    doc_q = torch.repeat_interleave(torch.arange(len(qdocs)), torch.tensor(qdocs))
    doc_k = torch.repeat_interleave(torch.arange(len(kdocs)), torch.tensor(kdocs))
    pos_q = torch.cat([torch.arange(n) for n in qdocs]) + torch.tensor(diag)[doc_q]
    pos_k = torch.cat([torch.arange(n) for n in kdocs])
    calls = 0
    for rank in range(world):
        pieces = V._doc_pieces(q_segs[rank], cu_q)
        plan = V._VarlenPlan(None, world, rank, "ring", k_segs, None, pieces, cu_k, diag, left,
                             right, None)  # fmt: skip
        q_rows = torch.tensor([i for s, n in q_segs[rank] for i in range(s, s + n)]).long()
        for hand in [[(0, cu_k[-1])]] + k_segs:
            k_rows = torch.tensor([j for s, n in hand for j in range(s, s + n)]).long()
            i, j = pos_q[q_rows][:, None], pos_k[k_rows][None]
            want = doc_q[q_rows][:, None] == doc_k[k_rows][None]
            if left >= 0:
                want &= j >= i - left
            if right >= 0:
                want &= j <= i + right
            got = torch.zeros_like(want, dtype=torch.int)
            for c in plan.calls(hand):
                calls += 1
                wl, wr = c.window if c.window is not None else (-1, -1)
                for s in range(len(c.cu_q) - 1):
                    nq, nk = c.cu_q[s + 1] - c.cu_q[s], c.cu_k[s + 1] - c.cu_k[s]
                    a = torch.arange(nq)[:, None] + (nk - nq if c.bottom_right else 0)
                    b = torch.arange(nk)[None]
                    seen = torch.ones(nq, nk, dtype=torch.bool)
                    if wl >= 0:
                        seen &= b >= a - wl
                    if wr >= 0:
                        seen &= b <= a + wr
                    q0, k0 = c.q0 + c.cu_q[s], c.k0 + c.cu_k[s]
                    got[q0 : q0 + nq, k0 : k0 + nk] += seen.int()
            assert torch.equal(got, want.int()), (rank, hand)
    return calls


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_calls_express_the_document_masks(layout: str) -> None:
    """The packed calls (documents cut into pieces, blocks cut and aligned top-left or
    bottom-right, gaps filled with sequences of no queries or no keys) see exactly the mask of
    every document, for causal, windows and Lq != Lk."""
    qdocs, kdocs = [9, 1, 0, 3, 14, 5], [6, 2, 3, 0, 17, 5]
    for world in (2, 3):
        for left, right, bottom_right in ((-1, -1, False), (-1, 0, False), (-1, 0, True),
                                          (3, 0, False), (2, 4, True), (-1, 2, False),
                                          (4, -1, True), (0, 0, False)):  # fmt: skip
            _mask_coverage(qdocs, kdocs, world, layout, left, right, bottom_right)
            _mask_coverage(qdocs, qdocs, world, layout, left, right, bottom_right)


def test_calls_do_not_grow_with_the_documents() -> None:
    """Blocks of one window run as the sequences of one call: causal zigzag takes 2 calls a K/V
    buffer (a document's two chunks overlap in keys) for one document as for ten."""
    for world in (2, 4):
        buffers = world * (world + 1)  # every rank: each shard and the whole
        one = _mask_coverage([40], [40], world, "zigzag", -1, 0, False)
        ten = _mask_coverage([40] * 10, [40] * 10, world, "zigzag", -1, 0, False)
        assert one == ten == 2 * buffers


def test_band_entries() -> None:
    """The closed-form count of a cut block's visible entries (the rule's work estimate) equals
    fmha.distributed's count of the same blocks."""
    for ql, kl in ((1, 1), (5, 9), (9, 5), (7, 7)):
        for delta in range(-12, 13, 3):
            for left, right in ((-1, -1), (-1, 0), (2, 0), (-1, 3), (4, 1), (0, 0), (3, -1)):
                c = cp._block_call(0, ql, 0, kl, delta, left, right)
                if c is not None:
                    assert V._band_entries(c) == cp._visible_entries(c), (ql, kl, delta, c)
