"""Strided inputs: [B, H, L, D] tensors passed as transposed views (no copy), stride-0 broadcast
q/k/v, expand()ed and broadcast-shaped bias, inputs whose last dimension is not contiguous.
Forward and every gradient against the float64 reference (fp32 on CPU, bf16 on CUDA, whose
backend runs fp16/bf16)."""

from __future__ import annotations

import pytest
import torch

import attention_reference as reference
import fmha
import fmha._bridge
from harness import DEVICES, WORKING_DTYPE as DTYPE, call, compare, randn


@pytest.mark.parametrize("device", DEVICES)
def test_bhld_tensors_pass_as_transposed_views_without_copy(device, monkeypatch):
    b, h, l, d = 2, 4, 11, 16
    q, k, v = (randn(b, h, l, d, seed=s).to(device, DTYPE[device]) for s in range(3))
    seen = {}
    original = fmha._bridge.view

    def spy(t, name, **kwargs):
        if t is not None and not kwargs.get("planned"):
            seen.setdefault(name, (t.data_ptr(), t.stride()))
        return original(t, name, **kwargs)

    monkeypatch.setattr(fmha._bridge, "view", spy)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    out = call(device, fmha.attention, qt, kt, vt, causal=True)
    assert out.shape == (b, l, h, d)
    for name, x in (("q", qt), ("k", kt), ("v", vt)):
        assert seen[name] == (x.data_ptr(), x.stride()), f"{name} was copied or restrided"


@pytest.mark.parametrize("device", DEVICES)
def test_bhld_transposed_views_match_reference(device):
    b, h, l, d = 2, 4, 11, 16
    mask = reference.sequence_mask(l, l, causal=True)

    def run_fmha(q, k, v):
        return fmha.attention(*(x.transpose(1, 2) for x in (q, k, v)), causal=True, return_lse=True)

    def run_reference(q, k, v):
        return reference.attention(*(x.transpose(1, 2) for x in (q, k, v)), mask=mask.to(q.device))

    inputs = {n: randn(b, h, l, d, seed=s) for s, n in enumerate("qkv")}
    compare(device, DTYPE[device], run_fmha, run_reference, inputs)


@pytest.mark.parametrize("device", DEVICES)
def test_stride_zero_batch_and_head_inputs(device):
    # k and v shared by every batch (stride 0 on B); q broadcast over heads (stride 0 on H).
    b, lq, lk, h, d = 3, 7, 9, 4, 8

    def expand(q, k, v):
        return q.expand(b, lq, h, d), k.expand(b, lk, 2, d), v.expand(b, lk, 2, d)

    def run_fmha(q, k, v):
        q, k, v = expand(q, k, v)
        assert q.stride(2) == 0 and k.stride(0) == 0
        return fmha.attention(q, k, v, return_lse=True)

    def run_reference(q, k, v):
        return reference.attention(*expand(q, k, v))

    inputs = {"q": randn(b, lq, 1, d, seed=1), "k": randn(1, lk, 2, d, seed=2),
              "v": randn(1, lk, 2, d, seed=3)}  # fmt: skip
    compare(device, DTYPE[device], run_fmha, run_reference, inputs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("how", ["expanded_view", "expanded_leaf", "last_dim_broadcast", "transposed"])
def test_bias_layouts(device, how):
    b, h, lq, lk, d = 2, 3, 6, 10, 8
    full = (b, h, lq, lk)
    leaf_views = {}
    if how == "expanded_view":  # [1, H, 1, Lk] expand()ed inside: the small tensor gets the sum
        bias = randn(1, h, 1, lk, seed=5)
        bias_of = lambda x: x.expand(*full)  # noqa: E731
    elif how == "expanded_leaf":  # the stride-0 tensor itself requires grad: per-element gradient
        bias = randn(1, h, 1, lk, seed=5)
        leaf_views["bias"] = lambda x: x.expand(*full)
        bias_of = lambda x: x  # noqa: E731
    elif how == "last_dim_broadcast":  # stride 0 on the key dimension
        bias = randn(b, h, lq, 1, seed=5)
        bias_of = lambda x: x.expand(*full)  # noqa: E731
    else:  # last dimension not contiguous: copied once
        bias = randn(b, h, lk, lq, seed=5)
        bias_of = lambda x: x.transpose(-1, -2)  # noqa: E731

    def run_fmha(q, k, v, bias):
        if how == "expanded_leaf":
            assert bias.stride(0) == 0 and bias.stride(2) == 0
        return fmha.attention(q, k, v, bias=bias_of(bias), return_lse=True)

    def run_reference(q, k, v, bias):
        return reference.attention(q, k, v, bias=bias_of(bias))

    inputs = {"q": randn(b, lq, h, d, seed=0), "k": randn(b, lk, h, d, seed=1),
              "v": randn(b, lk, h, d, seed=2), "bias": bias}  # fmt: skip
    compare(device, DTYPE[device], run_fmha, run_reference, inputs, leaf_views=leaf_views)


@pytest.mark.parametrize("device", DEVICES)
def test_inputs_with_non_contiguous_last_dim_are_copied(device):
    b, l, h, d = 2, 5, 2, 8

    def every_other(x):  # stride 2 on the last dimension
        return torch.stack([x, x], dim=-1)[..., 0]

    def run_fmha(q, k):
        assert every_other(q).stride(-1) == 2
        return fmha.attention(every_other(q), every_other(k), every_other(k), return_lse=True)

    def run_reference(q, k):
        return reference.attention(q, k, k)

    inputs = {"q": randn(b, l, h, d, seed=7), "k": randn(b, l, h, d, seed=8)}
    compare(device, DTYPE[device], run_fmha, run_reference, inputs)


def test_gradients_keep_the_layout_of_transposed_inputs():
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)  # [B, H, L, D]
    out = fmha.attention(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2))
    (dq,) = torch.autograd.grad(out.sum(), [q])
    assert dq.shape == q.shape and dq.is_contiguous()
