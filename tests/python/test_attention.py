"""fmha.attention: every SPEC feature, forward and every gradient, against the float64 reference;
gradcheck of the float64 CPU backend; deterministic mode; TF32."""

from __future__ import annotations

import os
import random

import pytest
import torch

import attention_reference as reference
import fmha
from harness import DEVICES, WORKING_DTYPE, call, case_params, compare, gradcheck, randn

# name -> (sizes, options). sizes: B, Lq, Lk, H, Hkv, D, Dv. Options use fmha's argument names;
# bias / rel_pos / sinks / extra_kv give the shapes of those inputs (R for extra keys).
CASES = {
    "plain": ((2, 17, 17, 4, 4, 16, 16), {}),
    "gqa_lq_ne_lk_dv_ne_d": ((2, 13, 21, 4, 2, 8, 12), {}),
    "mqa_odd_sizes": ((1, 7, 5, 3, 1, 5, 3), {}),
    "causal_top_left": ((2, 9, 14, 2, 2, 8, 8), {"causal": True}),
    "causal_bottom_right": ((2, 9, 14, 2, 2, 8, 8), {"causal": True, "causal_alignment": "bottom_right"}),
    "causal_bottom_right_masked_rows": ((1, 15, 9, 2, 1, 8, 8), {"causal": True, "causal_alignment": "bottom_right"}),
    "window": ((2, 16, 16, 2, 2, 8, 8), {"window": (3, 2)}),
    "window_bottom_right": ((1, 11, 19, 2, 2, 8, 8), {"window": (4, 1), "causal_alignment": "bottom_right"}),
    "window_and_causal": ((1, 16, 16, 2, 2, 8, 8), {"window": (5, -1), "causal": True}),
    "window_empty_rows": ((1, 12, 5, 2, 2, 8, 8), {"window": (0, 0)}),
    "scale": ((2, 8, 10, 2, 2, 8, 8), {"scale": 0.37}),
    "softcap": ((2, 8, 10, 2, 2, 8, 8), {"scale": 1.3, "softcap": 2.5}),
    "bias_full": ((2, 9, 11, 4, 2, 8, 8), {"bias": "B,H,Lq,Lk"}),
    "bias_heads": ((2, 9, 11, 4, 2, 8, 8), {"bias": "H,Lq,Lk"}),
    "bias_key_row": ((2, 9, 11, 4, 2, 8, 8), {"bias": "1,H,1,Lk"}),
    "bias_batch_keys": ((2, 9, 11, 4, 2, 8, 8), {"bias": "B,1,1,Lk"}),
    "bias_query_column": ((2, 9, 11, 4, 2, 8, 8), {"bias": "Lq,1"}),
    "rel_pos": ((2, 7, 12, 2, 2, 8, 8), {"rel_pos": ("B,H,Lq,3", "B,H,Lq,4")}),
    "rel_pos_broadcast": ((2, 7, 12, 2, 2, 8, 8), {"rel_pos": ("H,Lq,3", "1,1,Lq,4")}),
    "sinks": ((2, 9, 9, 4, 2, 8, 8), {"sinks": True}),
    "sinks_causal_masked_rows": ((1, 9, 4, 2, 2, 8, 8), {"sinks": True, "causal": True, "causal_alignment": "bottom_right"}),
    "extra_kv": ((2, 9, 10, 4, 2, 8, 6), {"extra_kv": 3}),
    "extra_kv_window_empty_rows": ((1, 10, 4, 2, 1, 8, 8), {"extra_kv": 2, "window": (0, 0)}),
    "everything": ((2, 10, 12, 4, 2, 8, 12), {
        "causal": True, "causal_alignment": "bottom_right", "window": (6, 1), "bias": "H,Lq,Lk",
        "rel_pos": ("B,H,Lq,4", "B,H,Lq,3"), "scale": 0.5, "softcap": 3.0, "sinks": True,
        "extra_kv": 2}),
    "empty_queries": ((2, 0, 5, 2, 2, 8, 8), {}),
    "empty_keys": ((2, 4, 0, 2, 2, 8, 8), {}),
    # No keys but a sink: lse is the sink's logit, out 0 (found by test_fuzz.py, whose draws made
    # attention_reference.py drop the sink when there were no keys at all).
    "empty_keys_sinks": ((2, 4, 0, 2, 2, 8, 8), {"sinks": True}),
}  # fmt: skip


def _shape(spec: str, sizes: dict) -> tuple:
    return tuple(int(sizes[s]) if s in sizes else int(s) for s in spec.split(","))


def make_inputs(sizes, options, seed=0):
    """Float64 CPU masters for a case, and fmha's options with tensors replaced by input names."""
    b, lq, lk, h, hkv, d, dv = sizes
    named = {"B": b, "Lq": lq, "Lk": lk, "H": h}
    inputs = {
        "q": randn(b, lq, h, d, seed=seed),
        "k": randn(b, lk, hkv, d, seed=seed + 1),
        "v": randn(b, lk, hkv, dv, seed=seed + 2),
    }
    if "bias" in options:
        inputs["bias"] = randn(*_shape(options["bias"], named), seed=seed + 3)
    if "rel_pos" in options:
        inputs["rel_h"] = randn(*_shape(options["rel_pos"][0], named), seed=seed + 4)
        inputs["rel_w"] = randn(*_shape(options["rel_pos"][1], named), seed=seed + 5)
    if options.get("sinks"):
        inputs["sinks"] = randn(h, seed=seed + 6)
    if "extra_kv" in options:
        r = options["extra_kv"]
        inputs["extra_k"] = randn(b, r, hkv, d, seed=seed + 7)
        inputs["extra_v"] = randn(b, r, hkv, dv, seed=seed + 8)
    return inputs


def fmha_call(options, return_lse=True, **fixed):
    """A function of the named input tensors that calls fmha.attention with `options`."""

    def run(q, k, v, bias=None, rel_h=None, rel_w=None, sinks=None, extra_k=None, extra_v=None):
        kwargs = {n: x for n, x in options.items() if n not in ("bias", "rel_pos", "sinks", "extra_kv")}
        return fmha.attention(
            q, k, v, bias=bias, rel_pos=None if rel_h is None else (rel_h, rel_w), sinks=sinks,
            extra_kv=None if extra_k is None else (extra_k, extra_v), return_lse=return_lse,
            **kwargs, **fixed,
        )  # fmt: skip

    return run


def reference_call(options):
    def run(q, k, v, bias=None, rel_h=None, rel_w=None, sinks=None, extra_k=None, extra_v=None):
        mask = reference.sequence_mask(
            q.shape[1], k.shape[1], causal=options.get("causal", False),
            alignment=options.get("causal_alignment", "top_left"), window=options.get("window"),
            device=q.device,
        )  # fmt: skip
        scale = options.get("scale")
        return reference.attention(
            q, k, v, scale=None if scale is None else reference.as_f32(scale),
            softcap=reference.as_f32(options.get("softcap", 0.0)), mask=mask, bias=bias,
            rel_pos=None if rel_h is None else (rel_h, rel_w), sinks=sinks,
            extra_kv=None if extra_k is None else (extra_k, extra_v),
        )  # fmt: skip

    return run


@pytest.mark.parametrize("case,device,dtype", case_params(CASES, ("plain", "everything")))
def test_matches_reference(case, device, dtype):
    sizes, options = CASES[case]
    compare(device, dtype, fmha_call(options), reference_call(options), make_inputs(sizes, options))


# A seeded random sweep over sizes and option combinations; FMHA_TEST_SWEEP raises the count and
# FMHA_TEST_SWEEP_SEED moves it.
_SWEEP_COUNT = int(os.environ.get("FMHA_TEST_SWEEP", "12"))
_SWEEP_SEED = int(os.environ.get("FMHA_TEST_SWEEP_SEED", "0"))


def _random_case(index):
    rng = random.Random(_SWEEP_SEED * 100003 + index)
    hkv = rng.choice([1, 2, 3])
    h = hkv * rng.choice([1, 2])
    lq, lk = rng.randint(0, 19), rng.randint(1, 19)
    sizes = (rng.randint(1, 2), lq, lk, h, hkv, rng.choice([1, 5, 8, 16, 24]), rng.choice([3, 8, 16]))
    options = {}
    if rng.random() < 0.5:
        options["causal"] = True
    if rng.random() < 0.5:
        options["causal_alignment"] = "bottom_right"
    if rng.random() < 0.4:
        options["window"] = (rng.randint(-1, 6), rng.randint(-1, 6))
    if rng.random() < 0.3:
        options["scale"] = rng.uniform(0.1, 1.5)
    if rng.random() < 0.3:
        options["softcap"] = rng.uniform(1.0, 8.0)
    if rng.random() < 0.4:
        options["bias"] = rng.choice(["B,H,Lq,Lk", "H,Lq,Lk", "1,H,1,Lk", "Lq,Lk", "B,1,Lq,1"])
    if rng.random() < 0.3 and lk in (4, 6, 8, 9, 12, 15, 16, 18):
        hk = next(d for d in (3, 4, 2) if lk % d == 0)
        options["rel_pos"] = (f"B,H,Lq,{hk}", f"H,Lq,{lk // hk}")
    if rng.random() < 0.3:
        options["sinks"] = True
    if rng.random() < 0.3:
        options["extra_kv"] = rng.randint(1, 3)
    return sizes, options


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index", range(_SWEEP_COUNT))
def test_random_sweep(index, device):
    sizes, options = _random_case(index)
    compare(device, WORKING_DTYPE[device], fmha_call(options), reference_call(options),
            make_inputs(sizes, options, seed=index))  # fmt: skip


# gradcheck (finite differences, float64, CPU backend): tiny sizes, every tensor input, both outputs.
GRADCHECK_CASES = ["gqa_lq_ne_lk_dv_ne_d", "causal_bottom_right_masked_rows", "window_and_causal",
                   "softcap", "bias_heads", "bias_key_row", "rel_pos_broadcast", "sinks", "extra_kv",
                   "everything"]  # fmt: skip


@pytest.mark.parametrize("case", GRADCHECK_CASES)
def test_gradcheck(case):
    (b, lq, lk, h, hkv, d, dv), options = CASES[case]
    small = (1, min(lq, 5), lk, h, hkv, min(d, 4), min(dv, 3))  # Lk kept: rel-pos needs Hk * Wk
    inputs = make_inputs(small, options, seed=11)
    run = fmha_call(options)
    names = list(inputs)
    tensors = tuple(inputs[n].requires_grad_(True) for n in names)
    gradcheck(lambda *xs: run(**dict(zip(names, xs))), tensors)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_is_bitwise_reproducible(device):
    sizes, options = CASES["everything"]
    dtype = WORKING_DTYPE[device]
    inputs = {n: t.to(device, dtype).requires_grad_(True) for n, t in make_inputs(sizes, options).items()}
    inputs["sinks"] = inputs["sinks"].detach().float().requires_grad_(True)
    run = fmha_call(options, deterministic=True)

    def once():
        out, lse = run(**inputs)
        grads = torch.autograd.grad((out.sum() + out.square().sum()) + lse.exp().sum(), list(inputs.values()))
        return [out, lse, *grads]

    first = call(device, once)
    second = call(device, once)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_allow_tf32_meets_its_tolerance(device):
    sizes, options = CASES["causal_bottom_right"]
    compare(device, torch.float32, fmha_call(options, allow_tf32=True), reference_call(options),
            make_inputs(sizes, options), allow_tf32=True)  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_return_lse_false_returns_out_only(device):
    q = torch.randn(1, 4, 2, 8, device=device, dtype=WORKING_DTYPE[device])
    out = call(device, fmha.attention, q, q, q)
    assert isinstance(out, torch.Tensor) and out.shape == (1, 4, 2, 8)
    out2, lse = call(device, fmha.attention, q, q, q, return_lse=True)
    assert torch.equal(out, out2) and lse.shape == (1, 2, 4) and lse.dtype == torch.float32
    assert out.dtype == q.dtype


def test_fully_masked_rows_give_zero_out_and_minus_inf_lse():
    q = torch.randn(1, 6, 2, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 3, 2, 8, dtype=torch.float64, requires_grad=True)
    out, lse = fmha.attention(q, k, k, causal=True, causal_alignment="bottom_right", return_lse=True)
    assert torch.equal(out[0, :3], torch.zeros_like(out[0, :3]))
    assert torch.isinf(lse[0, :, :3]).all() and (lse[0, :, :3] < 0).all()
    (dq,) = torch.autograd.grad(out.sum(), [q])
    assert torch.equal(dq[0, :3], torch.zeros_like(dq[0, :3]))
    assert torch.isfinite(dq).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")
def test_cuda_runs_on_the_current_stream(monkeypatch):
    import fmha._bridge

    streams = []

    class RecordingC:
        def __getattr__(self, name):
            return getattr(fmha._C, name)

        @staticmethod
        def run_allocating(params, stream, allocate):  # CUDA attention calls
            streams.append(stream)
            return fmha._C.run_allocating(params, stream, allocate)

    monkeypatch.setattr(fmha._bridge, "_C", RecordingC())
    q = torch.randn(2, 64, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    expected = call("cuda", fmha.attention, q, q, q, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fmha.attention(q, q, q, causal=True)
        out.float().sum().backward()
    torch.cuda.synchronize()
    assert streams[-2:] == [side.cuda_stream, side.cuda_stream]  # forward and backward
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
