"""fmha.attention_varlen: packed sequences (including empty ones) with every option that applies,
forward and gradients against the per-sequence float64 reference; gradcheck."""

from __future__ import annotations

import pytest
import torch

import attention_reference as reference
import fmha
from harness import case_params, compare, gradcheck, randn

SEQLENS_Q = [5, 0, 9, 3]
SEQLENS_K = [7, 3, 4, 11]


def _cu(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)


CASES = {
    "plain": {},
    "causal_top_left": {"causal": True},
    "causal_bottom_right": {"causal": True, "causal_alignment": "bottom_right"},
    "window": {"window": (2, 1), "causal_alignment": "bottom_right"},
    "bias_heads_broadcast": {"bias": True, "softcap": 2.0},
    "sinks_extra_kv": {"sinks": True, "extra_kv": 2},
    "everything": {"causal": True, "window": (3, -1), "bias": True, "scale": 0.4, "softcap": 4.0,
                   "sinks": True, "extra_kv": 1},
}  # fmt: skip


def make_inputs(options, h=4, hkv=2, d=8, dv=6, seed=0, seqlens_q=SEQLENS_Q, seqlens_k=SEQLENS_K):
    b = len(seqlens_q)
    inputs = {
        "q": randn(sum(seqlens_q), h, d, seed=seed),
        "k": randn(sum(seqlens_k), hkv, d, seed=seed + 1),
        "v": randn(sum(seqlens_k), hkv, dv, seed=seed + 2),
    }
    if options.get("bias"):  # [H, max_q, max_k], broadcast over the sequences
        inputs["bias"] = randn(h, max(seqlens_q), max(seqlens_k), seed=seed + 3)
    if options.get("sinks"):
        inputs["sinks"] = randn(h, seed=seed + 4)
    if "extra_kv" in options:
        inputs["extra_k"] = randn(b, options["extra_kv"], hkv, d, seed=seed + 5)
        inputs["extra_v"] = randn(b, options["extra_kv"], hkv, dv, seed=seed + 6)
    return inputs


def runners(options, seqlens_q=SEQLENS_Q, seqlens_k=SEQLENS_K):
    cu_q, cu_k = _cu(seqlens_q), _cu(seqlens_k)
    plain = {n: x for n, x in options.items() if n not in ("bias", "sinks", "extra_kv")}

    def run_fmha(q, k, v, bias=None, sinks=None, extra_k=None, extra_v=None):
        return fmha.attention_varlen(
            q, k, v, cu_q.to(q.device), cu_k.to(q.device), max(seqlens_q), max(seqlens_k),
            bias=bias, sinks=sinks, extra_kv=None if extra_k is None else (extra_k, extra_v),
            return_lse=True, **plain,
        )  # fmt: skip

    def run_reference(q, k, v, bias=None, sinks=None, extra_k=None, extra_v=None):
        def mask_fn(lq, lk):
            return reference.sequence_mask(
                lq, lk, causal=options.get("causal", False), window=options.get("window"),
                alignment=options.get("causal_alignment", "top_left"), device=q.device,
            )  # fmt: skip

        scale = options.get("scale")
        return reference.attention_varlen(
            q, k, v, cu_q.tolist(), cu_k.tolist(), bias=bias, sinks=sinks,
            extra_kv=None if extra_k is None else (extra_k, extra_v), mask_fn=mask_fn,
            scale=None if scale is None else reference.as_f32(scale),
            softcap=reference.as_f32(options.get("softcap", 0.0)),
        )  # fmt: skip

    return run_fmha, run_reference


@pytest.mark.parametrize("case,device,dtype", case_params(CASES, ("everything",)))
def test_matches_reference(case, device, dtype):
    options = CASES[case]
    run_fmha, run_reference = runners(options)
    compare(device, dtype, run_fmha, run_reference, make_inputs(options))


@pytest.mark.parametrize("case", ["causal_bottom_right", "everything"])
def test_gradcheck(case):
    options = CASES[case]
    seqlens_q, seqlens_k = [3, 0, 2], [2, 3, 4]
    inputs = make_inputs(options, h=2, hkv=1, d=4, dv=3, seed=5, seqlens_q=seqlens_q,
                         seqlens_k=seqlens_k)  # fmt: skip
    run_fmha, _ = runners(options, seqlens_q, seqlens_k)
    names = list(inputs)
    gradcheck(lambda *xs: run_fmha(**dict(zip(names, xs))),
              tuple(inputs[n].requires_grad_(True) for n in names))  # fmt: skip


def test_lse_layout_is_heads_by_total_q():
    q = torch.randn(10, 3, 8)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    out, lse = fmha.attention_varlen(q, q, q, cu, cu, 6, 6, return_lse=True)
    assert out.shape == (10, 3, 8) and lse.shape == (3, 10)


# ---- Offsets that break the contract (SPEC §8) -------------------------------------------------
# q has 9 rows in sequences of 4 and 5, k 11 in sequences of 5 and 6. CPU offsets are always
# checked; CUDA ones only with check_cu_seqlens=True (a sync), otherwise the kernels clamp what they
# read to the tensors (tests/cuda/test_cuda_varlen_safety.cpp checks that under compute-sanitizer).
_VALID = ([0, 4, 9], [0, 5, 11])
_BAD_OFFSETS = {
    "past_end": ([0, 4, 200], [0, 5, 100000]),
    "decreasing": ([0, 9, 4], [0, 11, 5]),
    "negative": ([-3, 4, 9], [0, -5, 11]),
    "huge": ([0, 2**31 - 1, -(2**31)], [2**31 - 1, 0, 2**31 - 1]),
    "longer_than_max": ([0, 9, 9], [0, 11, 11]),
}
_DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu"),
    pytest.param("cuda", torch.float16, id="cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device visible to torch")),
]  # fmt: skip


def _offset_call(device, dtype, offsets, **kwargs):
    """attention_varlen on the 9 / 11-row problem with these offsets (max_seqlen 5 and 6)."""
    q, k, v = (randn(rows, 2, 16, seed=rows).to(device, dtype) for rows in (9, 11, 11))
    cu_q, cu_k = (torch.tensor(o, dtype=torch.int32, device=device) for o in offsets)
    return fmha.attention_varlen(q, k, v, cu_q, cu_k, 5, 6, return_lse=True, **kwargs)


def _cpu_message(offsets) -> str:
    with pytest.raises(ValueError) as refused:
        _offset_call("cpu", torch.float32, offsets)
    return str(refused.value)


@pytest.mark.parametrize("name", sorted(_BAD_OFFSETS))
@pytest.mark.parametrize("device,dtype", _DEVICE_DTYPES)
def test_check_cu_seqlens_refuses_bad_offsets_with_the_cpu_message(device, dtype, name):
    expected = _cpu_message(_BAD_OFFSETS[name])
    assert "cu_seqlens" in expected
    with pytest.raises(ValueError) as refused:
        _offset_call(device, dtype, _BAD_OFFSETS[name], check_cu_seqlens=True)
    assert str(refused.value) == expected


@pytest.mark.parametrize("device,dtype", _DEVICE_DTYPES)
def test_check_cu_seqlens_accepts_valid_offsets_and_changes_nothing(device, dtype):
    checked = _offset_call(device, dtype, _VALID, check_cu_seqlens=True)
    plain = _offset_call(device, dtype, _VALID)
    for a, b in zip(checked, plain):
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")
@pytest.mark.parametrize("name", sorted(_BAD_OFFSETS))
def test_unchecked_bad_cuda_offsets_run_and_leave_the_device_usable(name):
    q, k, v = (randn(rows, 2, 16, seed=rows).cuda().half().requires_grad_(True) for rows in (9, 11, 11))
    cu_q, cu_k = (torch.tensor(o, dtype=torch.int32, device="cuda") for o in _BAD_OFFSETS[name])
    out = fmha.attention_varlen(q, k, v, cu_q, cu_k, 5, 6)
    out.float().nan_to_num().sum().backward()
    torch.cuda.synchronize()  # no CUDA error from the clamped kernels
    if name == "past_end":  # clamped to the row counts: the valid offsets
        valid = _offset_call("cuda", torch.float16, _VALID)[0]
        assert torch.equal(out, valid)
    again = _offset_call("cuda", torch.float16, _VALID)[0]
    assert torch.isfinite(again).all()
