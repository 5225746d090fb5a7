"""fmha.distributed (SPEC §17): context-parallel attention on 2 and 4 CPU processes (gloo) against
single-process fmha.attention on the whole sequence: out, lse and every gradient, for both forms,
both layouts, causal (both alignments) and not, GQA/MQA, windows, softcap, sinks and uneven shards.

Each world size is one group of spawned processes that runs every case and reports per case the
norm-wise relative error of each result (or the exception); the tests below read those reports.

On a machine with several GPUs, FMHA_DISTRIBUTED_DEVICE=cuda runs the same cases with one GPU a
rank over NCCL (2 and 4 ranks where that many GPUs exist), against the same references computed
on the CPU; the float64 cases skip there (float64 runs on the CPU only). Their head dims are at
most 32: a build with the head-dim bucket 32 runs them all.

    FMHA_DISTRIBUTED_DEVICE=cuda python -m pytest -q tests/python/test_distributed.py"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import fmha
from attention_reference import attention as naive_attention
from attention_reference import sequence_mask
from distributed_group import (DEVICE, LOW_PRECISION, MARKS, TOLERANCE, WORLDS,
                               check_all_true, check_case, entries, rel_error)  # fmt: skip

# An installed package older than the module skips, visibly (CI installs the tree first).
cp = pytest.importorskip("fmha.distributed", reason="the installed fmha has no fmha.distributed")

pytestmark = MARKS


def _uneven(total: int, world: int) -> list[int]:
    """Unequal contiguous lengths: rank r gets a share proportional to r + 1."""
    weights = [r + 1 for r in range(world)]
    lens = [total * w // sum(weights) for w in weights]
    lens[-1] += total - sum(lens)
    return lens


def _with_empty(total: int, world: int) -> list[int]:
    """Unequal lengths with an empty first shard."""
    return [0] + _uneven(total, world - 1)


# name: options of the case. Defaults: B 2, Lq = Lk = 24, H 4, Hkv 4, D 8, fp32, contiguous, ring.
CASES = {
    "dense-ring": dict(),
    "dense-allgather": dict(form="allgather"),
    "dense-zigzag": dict(layout="zigzag", Lq=27, Lk=27),
    "strided-inputs-ring": dict(strided=True, causal=True, layout="zigzag", H=4, Hkv=2),
    "strided-inputs-allgather": dict(strided=True, causal=True, form="allgather", H=4, Hkv=2),
    "causal-zigzag-ring": dict(layout="zigzag", causal=True, Lq=29, Lk=29),
    "causal-zigzag-allgather": dict(layout="zigzag", causal=True, form="allgather", Lq=29, Lk=29),
    "causal-contiguous-ring": dict(causal=True, Lq=26, Lk=26),
    "causal-bottom-right-longer-k": dict(causal=True, align="bottom_right", Lq=17, Lk=31),
    "causal-bottom-right-longer-q": dict(causal=True, align="bottom_right", Lq=31, Lk=17,
                                         layout="zigzag"),
    "causal-top-left-longer-q-allgather": dict(causal=True, Lq=30, Lk=19, form="allgather"),
    "gqa-causal-zigzag": dict(H=4, Hkv=2, layout="zigzag", causal=True, Lq=25, Lk=25),
    "mqa-allgather": dict(H=4, Hkv=1, form="allgather", causal=True),
    "window": dict(window=(5, 3), Lq=33, Lk=33),
    "window-causal-zigzag-allgather": dict(window=(6, -1), causal=True, layout="zigzag",
                                           form="allgather", Lq=31, Lk=31),
    "window-left-unbounded-bottom-right": dict(window=(-1, 2), align="bottom_right", Lq=20, Lk=28),
    "softcap-sinks-ring": dict(softcap=3.0, sinks=True, causal=True, layout="zigzag"),
    "softcap-sinks-allgather": dict(softcap=3.0, sinks=True, window=(4, 4), form="allgather"),
    "sinks-masked-rows": dict(sinks=True, causal=True, align="bottom_right", Lq=30, Lk=14),
    "uneven-ring": dict(lengths=_uneven, causal=True, Lq=37, Lk=37),
    "uneven-allgather": dict(lengths=_uneven, causal=True, form="allgather", Lq=37, Lk=37),
    "empty-shard-ring": dict(lengths=_with_empty, window=(3, 7), Lq=23, Lk=23),
    "no-keys-ring": dict(Lq=10, Lk=0, sinks=True),
    "no-keys-allgather": dict(Lq=10, Lk=0, form="allgather"),
    "extra-kv-ring": dict(extra=3, causal=True, layout="zigzag", H=4, Hkv=2, sinks=True),
    "extra-kv-allgather": dict(extra=2, window=(3, 3), form="allgather", softcap=2.5),
    "extra-kv-no-keys": dict(extra=2, Lq=9, Lk=0),
    "extra-kv-bfloat16-direct": dict(extra=70, dtype=torch.bfloat16, backward="direct", causal=True,
                                     layout="zigzag", Lq=lambda w: 140 * w,
                                     Lk=lambda w: 140 * w, B=1, H=2),
    "extra-kv-float64": dict(extra=2, dtype=torch.float64, causal=True, align="bottom_right", Lq=20,
                             Lk=26),
    "dv-differs-scale": dict(D=8, Dv=12, scale=0.7, causal=True, layout="zigzag"),
    "float64-ring": dict(dtype=torch.float64, causal=True, layout="zigzag", sinks=True, softcap=2.0,
                         H=4, Hkv=2),
    "bfloat16-ring": dict(dtype=torch.bfloat16, causal=True, layout="zigzag", H=4, Hkv=2, Lq=40,
                          Lk=40, sinks=True),
    "float16-allgather": dict(dtype=torch.float16, window=(7, 0), form="allgather", Lq=40, Lk=40),
    "bfloat16-direct-backward": dict(dtype=torch.bfloat16, backward="direct", causal=True,
                                     layout="zigzag", Lq=lambda w: 140 * w, Lk=lambda w: 140 * w,
                                     B=1, H=2),
    "float64-allgather": dict(dtype=torch.float64, window=(4, 2), form="allgather", Lq=21, Lk=21),
    "auto-form-no-lse": dict(form="auto", causal=True, layout="zigzag", lse=False),
    # The backward that CUDA takes ('direct': every block's backward gets the merged out and lse),
    # run here on the fast CPU backend, which reads Delta from the given out (as CUDA does) when
    # a call has more keys than its one key tile (64): so blocks of 70+ keys (and 70 extra keys).
    "direct-backward-causal-zigzag": dict(backward="direct", layout="zigzag", causal=True,
                                          sinks=True, Lq=lambda w: 140 * w, Lk=lambda w: 140 * w,
                                          B=1, H=2, Hkv=1),
    "direct-backward-window-allgather": dict(backward="direct", form="allgather", window=(90, 0),
                                             Lq=lambda w: 70 * w + 3, Lk=lambda w: 70 * w + 3, B=1,
                                             H=2),
}


def _leaves(extra):
    return None if extra is None else tuple(t.clone().requires_grad_() for t in extra)


def _leaf_inputs(q, k, v, sinks, extra):
    """Copies of a call's inputs that collect their gradients: [q, k, v], sinks, extra_kv."""
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    sinks = sinks.clone().requires_grad_() if sinks is not None else None
    return inputs, sinks, _leaves(extra)


def _results(out, lse, inputs, sinks, extra, want_lse) -> dict:
    """out, lse and every gradient of a call made on _leaf_inputs, by name."""
    results = dict(out=out.detach(), dq=inputs[0].grad, dk=inputs[1].grad, dv=inputs[2].grad)
    if want_lse:
        results["lse"] = lse.detach()
    if sinks is not None:
        results["dsinks"] = sinks.grad
    if extra is not None:
        results["dextra_k"], results["dextra_v"] = extra[0].grad, extra[1].grad
    return results


def _single_process(q, k, v, sinks, extra, dout, dlse, opts, want_lse) -> dict:
    """fmha.attention on the whole sequence: every result and gradient."""
    inputs, sinks, extra = _leaf_inputs(q, k, v, sinks, extra)
    out, lse = fmha.attention(*inputs, sinks=sinks, extra_kv=extra, return_lse=True, **opts)
    torch.autograd.backward([out, lse] if want_lse else [out], [dout, dlse] if want_lse else [dout])
    return _results(out, lse, inputs, sinks, extra, want_lse)


def _naive(q, k, v, sinks, extra, dout, dlse, opts, want_lse) -> dict:
    """The naive implementation of tests/python/attention_reference.py in q's dtype: what SPEC §13
    measures fp16 / bf16 results against."""
    inputs, sinks, extra = _leaf_inputs(q, k, v, sinks, extra)
    mask = sequence_mask(q.shape[1], k.shape[1], causal=opts["causal"],
                         alignment=opts["causal_alignment"], window=opts["window"])  # fmt: skip
    out, lse = naive_attention(*inputs, scale=opts["scale"], softcap=opts["softcap"], mask=mask,
                               sinks=sinks, extra_kv=extra)  # fmt: skip
    finite_lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    torch.autograd.backward([out, finite_lse] if want_lse else [out],
                            [dout, dlse.to(lse.dtype)] if want_lse else [dout])  # fmt: skip
    return _results(out, lse, inputs, sinks, extra, want_lse)


def _to_device(t):
    return None if t is None else t.to(DEVICE)


def _run_case(spec: dict, world: int) -> dict:
    if DEVICE != "cpu" and spec.get("dtype") == torch.float64:
        return {"skipped": f"float64 runs on the CPU only, not on {DEVICE}"}
    g = torch.Generator().manual_seed(len(spec) * 7919 + world)
    B, H, Hkv = spec.get("B", 2), spec.get("H", 4), spec.get("Hkv", spec.get("H", 4))
    Lq, Lk = (x(world) if callable(x) else x for x in (spec.get("Lq", 24), spec.get("Lk", 24)))
    D = spec.get("D", 8)
    Dv, dtype = spec.get("Dv", D), spec.get("dtype", torch.float32)
    layout, form = spec.get("layout", "contiguous"), spec.get("form", "ring")
    want_lse = spec.get("lse", True)
    opts = dict(causal=spec.get("causal", False), causal_alignment=spec.get("align", "top_left"),
                window=spec.get("window"), softcap=spec.get("softcap", 0.0),
                scale=spec.get("scale"))  # fmt: skip
    q = torch.randn(B, Lq, H, D, generator=g).to(dtype)
    k = torch.randn(B, Lk, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, Lk, Hkv, Dv, generator=g).to(dtype)
    dout = torch.randn(B, Lq, H, Dv, generator=g).to(dtype)
    stats_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    dlse = torch.randn(B, H, Lq, generator=g, dtype=stats_dtype)
    sinks = torch.randn(H, generator=g) if spec.get("sinks") else None
    R = spec.get("extra", 0)
    extra = None
    if R:
        extra = (torch.randn(B, R, Hkv, D, generator=g).to(dtype),
                 torch.randn(B, R, Hkv, Dv, generator=g).to(dtype))

    if dtype in LOW_PRECISION:
        # SPEC §13: error against float64 <= 2 x a naive same-dtype implementation's + 1e-4.
        wide = [t.double() for t in (q, k, v, dout, dlse)]
        wide_extra = None if extra is None else tuple(t.double() for t in extra)
        reference = _single_process(*wide[:3], sinks, wide_extra, *wide[3:], opts, want_lse)
        naive = _naive(q, k, v, sinks, extra, dout, dlse, opts, want_lse)
        tolerance = {n: 2 * rel_error(naive[n], reference[n]) + 1e-4 for n in reference}
    else:
        reference = _single_process(q, k, v, sinks, extra, dout, dlse, opts, want_lse)
        tolerance = {n: TOLERANCE[dtype] for n in reference}
    # sinks, and so dsinks, are fp32
    tolerance["dsinks"] = max(tolerance.get("dsinks", 0.0), TOLERANCE[torch.float32])

    lengths = spec.get("lengths")
    q_lens = lengths(Lq, world) if lengths else None
    k_lens = lengths(Lk, world) if lengths else None
    mine = [cp.shard(t.to(DEVICE), layout=layout, lengths=n)
            for t, n in ((q, q_lens), (k, k_lens), (v, k_lens))]  # fmt: skip
    if spec.get("strided"):  # [B, H, L, D] storage seen as [B, L, H, D], as models pass it
        mine = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in mine]
    mine = [t.detach().requires_grad_() for t in mine]
    shard_sinks = sinks.to(DEVICE).requires_grad_() if sinks is not None else None
    shard_extra = _leaves(None if extra is None else tuple(t.to(DEVICE) for t in extra))
    modes = dict(cp._BACKWARD_MODE)
    if "backward" in spec:
        cp._BACKWARD_MODE[DEVICE] = spec["backward"]
    try:
        result = cp.attention(*mine, layout=layout, form=form, sinks=shard_sinks,
                              extra_kv=shard_extra, return_lse=want_lse, **opts)  # fmt: skip
    finally:
        cp._BACKWARD_MODE.clear()
        cp._BACKWARD_MODE.update(modes)
    out, lse = result if want_lse else (result, None)
    local_dout = cp.shard(dout.to(DEVICE), layout=layout, lengths=q_lens)
    if want_lse:
        local_dlse = cp.shard(dlse.to(DEVICE), layout=layout, dim=2, lengths=q_lens)
        torch.autograd.backward([out, lse], [local_dout, local_dlse])
    else:
        out.backward(local_dout)

    whole = dict(out=cp.unshard(out.detach(), layout=layout).cpu(),
                 dq=cp.unshard(mine[0].grad, layout=layout).cpu(),
                 dk=cp.unshard(mine[1].grad, layout=layout).cpu(),
                 dv=cp.unshard(mine[2].grad, layout=layout).cpu())  # fmt: skip
    if want_lse:
        whole["lse"] = cp.unshard(lse.detach(), layout=layout, dim=2).cpu()
    if sinks is not None:
        dsinks = shard_sinks.grad.clone()
        dist.all_reduce(dsinks)  # each rank holds its queries' part
        whole["dsinks"] = dsinks.cpu()
    if extra is not None:  # likewise
        for name, t in zip(("dextra_k", "dextra_v"), shard_extra):
            grad = t.grad.clone()
            dist.all_reduce(grad)
            whole[name] = grad.cpu()
    errors = {n: rel_error(whole[n], reference[n]) for n in whole}
    # This rank's out against its own shard of the single-process one (shard and unshard agree).
    errors["out-local"] = rel_error(out.cpu(), cp.shard(reference["out"], layout=layout, lengths=q_lens))
    tolerance["out-local"] = tolerance["out"]
    return {"errors": errors, "tolerance": tolerance, "form": form}


def _run_refusals(world: int) -> dict:
    """Calls that must be refused on every rank, with the exception type each raised."""
    x = torch.randn(1, 5, 2, 4, device=DEVICE)
    raised = {}
    for name, call in (
        ("bias", lambda: cp.attention(x, x, x, bias=torch.zeros(1, device=DEVICE))),
        ("extra-kv-heads", lambda: cp.attention(x, x, x, extra_kv=(x[:, :2, :1], x[:, :2, :1]))),
        ("bad-layout", lambda: cp.attention(x, x, x, layout="ring")),
        ("bad-form", lambda: cp.attention(x, x, x, form="p2p")),
        ("dtype-mismatch", lambda: cp.attention(x, x.double(), x)),
        ("sinks-dtype", lambda: cp.attention(x, x, x, sinks=torch.zeros(2, dtype=torch.bfloat16,
                                                                        device=DEVICE))),
        ("heads", lambda: cp.attention(x, torch.randn(1, 5, 3, 4, device=DEVICE),
                                       torch.randn(1, 5, 3, 4, device=DEVICE))),
        # Rank 0 holding 3 rows and the others 1 is no zigzag shard of any sequence.
        ("zigzag-lengths", lambda: cp.attention(*[x[:, : 3 if dist.get_rank() == 0 else 1]] * 3,
                                                layout="zigzag")),
    ):  # fmt: skip
        try:
            call()
            raised[name] = None
        except Exception as e:  # noqa: BLE001 (the type is the result)
            raised[name] = type(e).__name__
    return raised


def _run_helpers(world: int) -> dict:
    """The shard helpers and the call's variants that must agree exactly: name -> True, or what
    went wrong."""
    rank = dist.get_rank()
    checks = {}
    g = torch.Generator().manual_seed(5)
    for layout in cp.LAYOUTS:
        for S in (1, 2 * world + 3, 40):
            x = torch.randn(3, 2, S, 5, generator=g).to(DEVICE)
            mine = cp.shard(x, layout=layout, dim=2)
            positions = cp.shard_positions(S, layout=layout)
            segs = cp.layout_segments(S, world, layout)[rank]
            expected = [i for s, n in segs for i in range(s, s + n)]
            checks[f"positions-{layout}-{S}"] = positions.tolist() == expected
            checks[f"shard-{layout}-{S}"] = torch.equal(mine, x[:, :, positions.to(x.device)])
            checks[f"unshard-{layout}-{S}"] = torch.equal(cp.unshard(mine, layout=layout, dim=2), x)
    lens = _with_empty(23, world)
    x = torch.randn(2, 23, 3, generator=g).to(DEVICE)
    mine = cp.shard(x, lengths=lens)
    checks["shard-lengths"] = mine.shape[1] == lens[rank]
    checks["unshard-lengths"] = torch.equal(cp.unshard(mine), x)

    q, k, v = (torch.randn(1, 6, 4, 8, generator=g).to(DEVICE) for _ in range(3))
    every = [6] * world
    a = cp.attention(q, k, v, causal=True, layout="zigzag")
    b = cp.attention(q, k, v, causal=True, layout="zigzag", lengths=(every, every))
    checks["explicit-lengths"] = torch.equal(a, b)
    with torch.no_grad():
        c = cp.attention(q.requires_grad_(), k, v, causal=True, layout="zigzag")
    d = cp.attention(q, k, v, causal=True, layout="zigzag")
    checks["no-grad-path"] = torch.equal(c, d.detach()) and not c.requires_grad and d.requires_grad

    # deterministic=True: bitwise the same results and gradients on a second run (fixed order of
    # calls, merges and transfers).
    runs = []
    for _ in range(2):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        for form in ("ring", "allgather"):
            out = cp.attention(*leaves, causal=True, layout="zigzag", form=form, deterministic=True)
            out.backward(torch.ones_like(out))
        runs.append([out.detach()] + [t.grad for t in leaves])
    checks["deterministic"] = all(torch.equal(a, b) for a, b in zip(*runs))

    # Under torch.compile the call runs eagerly between two graphs (a graph break).
    def model(q, k, v):
        return cp.attention(q * 2, k, v, causal=True, layout="zigzag").sum(-1)

    qg = q.detach().requires_grad_()
    compiled = torch.compile(model, backend="eager")(qg, k, v)
    compiled.sum().backward()
    qe = q.detach().requires_grad_()
    eager = model(qe, k, v)
    eager.sum().backward()
    checks["torch-compile"] = torch.equal(compiled, eager) and torch.equal(qg.grad, qe.grad)
    return checks


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_single_process(world: int, case: str) -> None:
    check_case(world, case, __name__, {"out", "dq", "dk", "dv"})


@pytest.mark.parametrize("world", WORLDS)
def test_refusals(world: int) -> None:
    for _, refusals in entries(world, "refusals", __name__):
        assert refusals == {
            "bias": "NotImplementedError",
            "extra-kv-heads": "ValueError",
            "bad-layout": "ValueError",
            "bad-form": "ValueError",
            "dtype-mismatch": "TypeError",
            "sinks-dtype": "TypeError",
            "heads": "ValueError",
            "zigzag-lengths": "ValueError",
        }


@pytest.mark.parametrize("world", WORLDS)
def test_shard_helpers_and_call_variants(world: int) -> None:
    check_all_true(world, "helpers", __name__, 10)


# ---- Without processes ---------------------------------------------------------------------------


def test_layout_segments() -> None:
    # 10 rows in 4 zigzag chunks of 3, 3, 2, 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1, 2.
    assert cp.layout_segments(10, 2, "zigzag") == [[(0, 3), (8, 2)], [(3, 3), (6, 2)]]
    assert cp.layout_segments(10, 3, "contiguous") == [[(0, 4)], [(4, 3)], [(7, 3)]]
    assert cp.layout_segments(9, 3, "contiguous", lengths=[0, 2, 7]) == [
        [(0, 0)], [(0, 2)], [(2, 7)]
    ]
    for world in (1, 2, 3, 4):
        for n in (0, 1, 7, 16, 33):
            for layout in cp.LAYOUTS:
                rows = [i for segs in cp.layout_segments(n, world, layout) for s, m in segs
                        for i in range(s, s + m)]  # fmt: skip
                assert sorted(rows) == list(range(n))
    with pytest.raises(ValueError, match="lengths"):
        cp.layout_segments(9, 3, "contiguous", lengths=[1, 2, 3])
    with pytest.raises(ValueError, match="layout"):
        cp.layout_segments(9, 3, "striped")


def test_block_calls_express_the_mask() -> None:
    """Every block's call (rows and keys cut, top-left window) sees exactly the keys the global
    band i + delta - left <= j <= i + delta + right allows."""
    torch.manual_seed(0)
    for ql, kl in ((1, 1), (5, 9), (9, 5), (7, 7)):
        for delta in range(-12, 13, 3):
            for left, right in ((-1, -1), (-1, 0), (2, 0), (-1, 3), (4, 1), (0, 0), (3, -1)):
                want = torch.zeros(ql, kl, dtype=torch.bool)
                for i in range(ql):
                    for j in range(kl):
                        want[i, j] = (left < 0 or j >= i + delta - left) and (
                            right < 0 or j <= i + delta + right
                        )
                call = cp._block_call(0, ql, 0, kl, delta, left, right)
                got = torch.zeros(ql, kl, dtype=torch.bool)
                if call is not None:
                    wl, wr = call.window if call.window is not None else (-1, -1)
                    assert wl >= -1 and wr >= -1
                    for i in range(call.q0, call.q1):
                        for j in range(call.k0, call.k1):
                            a, b = i - call.q0, j - call.k0
                            got[i, j] = (wl < 0 or b >= a - wl) and (wr < 0 or b <= a + wr)
                assert torch.equal(got, want), (ql, kl, delta, left, right, call)


def test_choose_form() -> None:
    # GQA 32/8 at 128k on 2 ranks: the gathered K/V is small next to the work: all-gather.
    gqa = cp.choose_form([65536] * 2, [65536] * 2, 32, 8, 128, layout="zigzag", causal=True)
    assert gqa == "allgather"
    # MHA 16 on 4 ranks at 128k: ring.
    mha = cp.choose_form([32768] * 4, [32768] * 4, 16, 16, 128, layout="zigzag", causal=True)
    assert mha == "ring"
    # The measured cells the rule's share sits between (H200s, 2026-11-28): GQA on 4 ranks ran
    # faster all-gathered, MHA on 2 ranks faster in the ring.
    gqa4 = cp.choose_form([32768] * 4, [32768] * 4, 32, 8, 128, layout="zigzag", causal=True)
    mha2 = cp.choose_form([65536] * 2, [65536] * 2, 16, 16, 128, layout="zigzag", causal=True)
    assert (gqa4, mha2) == ("allgather", "ring")
    assert cp.choose_form([100], [100], 4, 4, 8) == "ring"  # one rank: no transfer at all
