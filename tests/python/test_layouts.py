"""Strided inputs: [B, H, L, D] tensors passed as transposed views (no copy), stride-0 broadcast
q/k/v, expand()ed and broadcast-shaped bias, inputs whose last dimension is not contiguous."""

from __future__ import annotations

import pytest
import torch

import attention_reference as reference
import fmha
import fmha._bridge
from harness import DEVICES, assert_close, call, randn


def _grads(out, lse, inputs, seed=3):
    generator = torch.Generator().manual_seed(seed)
    g_out = torch.randn(out.shape, generator=generator, dtype=torch.float64).to(out.device, out.dtype)
    g_lse = torch.randn(lse.shape, generator=generator, dtype=torch.float64).to(lse.device, lse.dtype)
    loss = (out * g_out).sum() + (torch.where(torch.isfinite(lse), lse, 0) * g_lse).sum()
    return torch.autograd.grad(loss, inputs)


def _check_against_reference(device, fmha_inputs, ref_inputs, run_fmha, run_ref, bound=1e-5):
    out, lse = call(device, run_fmha, *fmha_inputs)
    ref_out, ref_lse = run_ref(*ref_inputs)
    assert_close("out", out, ref_out, bound)
    assert_close("lse", lse, ref_lse, bound)
    grads = call(device, _grads, out, lse, fmha_inputs)
    ref_grads = _grads(ref_out, ref_lse, ref_inputs)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert_close(f"grad {i}", g, r, bound)


@pytest.mark.parametrize("device", DEVICES)
def test_bhld_tensors_pass_as_transposed_views_without_copy(device, monkeypatch):
    b, h, l, d = 2, 4, 11, 16
    q, k, v = (randn(b, h, l, d, seed=s).float().to(device).requires_grad_(True) for s in range(3))
    seen = {}
    original = fmha._bridge.view

    def spy(t, name, **kwargs):
        if t is not None and not kwargs.get("planned"):
            seen.setdefault(name, (t.data_ptr(), t.stride()))
        return original(t, name, **kwargs)

    monkeypatch.setattr(fmha._bridge, "view", spy)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    out = call(device, fmha.attention, qt, kt, vt, causal=True)
    for name, x in (("q", qt), ("k", kt), ("v", vt)):
        assert seen[name] == (x.data_ptr(), x.stride()), f"{name} was copied or restrided"
    monkeypatch.undo()

    ref_inputs = [x.detach().double().cpu().requires_grad_(True) for x in (q, k, v)]
    mask = reference.sequence_mask(l, l, causal=True)

    def run_ref(q_, k_, v_):
        return reference.attention(*(x.transpose(1, 2) for x in (q_, k_, v_)), mask=mask)

    def run_fmha(q_, k_, v_):
        return fmha.attention(*(x.transpose(1, 2) for x in (q_, k_, v_)), causal=True, return_lse=True)

    assert out.shape == (b, l, h, d)
    _check_against_reference(device, [q, k, v], ref_inputs, run_fmha, run_ref)


@pytest.mark.parametrize("device", DEVICES)
def test_stride_zero_batch_and_head_inputs(device):
    # k and v shared by every batch (stride 0 on B); q broadcast over heads (stride 0 on H).
    b, lq, lk, h, d = 3, 7, 9, 4, 8
    q1 = randn(b, lq, 1, d, seed=1).float().to(device).requires_grad_(True)
    k1 = randn(1, lk, 2, d, seed=2).float().to(device).requires_grad_(True)
    v1 = randn(1, lk, 2, d, seed=3).float().to(device).requires_grad_(True)

    def expand(q_, k_, v_):
        return q_.expand(b, lq, h, d), k_.expand(b, lk, 2, d), v_.expand(b, lk, 2, d)

    def run_fmha(*xs):
        q, k, v = expand(*xs)
        assert q.stride(2) == 0 and k.stride(0) == 0
        return fmha.attention(q, k, v, return_lse=True)

    def run_ref(*xs):
        return reference.attention(*expand(*xs))

    ref_inputs = [x.detach().double().cpu().requires_grad_(True) for x in (q1, k1, v1)]
    _check_against_reference(device, [q1, k1, v1], ref_inputs, run_fmha, run_ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("how", ["expanded_view", "expanded_leaf", "last_dim_broadcast", "transposed"])
def test_bias_layouts(device, how):
    b, h, lq, lk, d = 2, 3, 6, 10, 8
    q, k, v = (randn(b, n, h, d, seed=s).float().to(device).requires_grad_(True)
               for s, n in ((0, lq), (1, lk), (2, lk)))  # fmt: skip
    if how == "expanded_view":  # [1, H, 1, Lk] expand()ed to the full shape: the base gets the sum
        base = randn(1, h, 1, lk, seed=5)
        bias_of = lambda x: x.expand(b, h, lq, lk)  # noqa: E731
    elif how == "expanded_leaf":  # the stride-0 tensor itself requires grad: per-element gradient
        base = randn(1, h, 1, lk, seed=5).expand(b, h, lq, lk)
        bias_of = lambda x: x  # noqa: E731
    elif how == "last_dim_broadcast":  # stride 0 on the key dimension
        base = randn(b, h, lq, 1, seed=5)
        bias_of = lambda x: x.expand(b, h, lq, lk)  # noqa: E731
    else:  # last dimension not contiguous: copied once
        base = randn(b, h, lk, lq, seed=5)
        bias_of = lambda x: x.transpose(-1, -2)  # noqa: E731
    if how == "expanded_leaf":
        bias = base[:1, :, :1].float().to(device).expand(b, h, lq, lk).detach().requires_grad_(True)
        ref_bias = base.detach().requires_grad_(True)
        assert bias.stride()[0] == 0 and ref_bias.stride()[0] == 0
    else:
        bias = base.float().to(device).requires_grad_(True)
        ref_bias = base.detach().clone().requires_grad_(True)

    def run_fmha(q_, k_, v_, bias_):
        return fmha.attention(q_, k_, v_, bias=bias_of(bias_), return_lse=True)

    def run_ref(q_, k_, v_, bias_):
        return reference.attention(q_, k_, v_, bias=bias_of(bias_))

    ref_inputs = [x.detach().double().cpu().requires_grad_(True) for x in (q, k, v)] + [ref_bias]
    _check_against_reference(device, [q, k, v, bias], ref_inputs, run_fmha, run_ref)


@pytest.mark.parametrize("device", DEVICES)
def test_inputs_with_non_contiguous_last_dim_are_copied(device):
    b, l, h, d = 2, 5, 2, 8
    base = randn(b, l, h, d, 2, seed=7).float().to(device)
    q = base[..., 0]  # stride 2 on the last dimension
    assert q.stride(-1) == 2
    k = base[..., 1]
    out, lse = call(device, fmha.attention, q, k, k, return_lse=True)
    ref_out, ref_lse = reference.attention(*(x.double().cpu() for x in (q, k, k)))
    assert_close("out", out, ref_out, 1e-5)
    assert_close("lse", lse, ref_lse, 1e-5)


def test_gradients_keep_the_layout_of_transposed_inputs():
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)  # [B, H, L, D]
    out = fmha.attention(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2))
    (dq,) = torch.autograd.grad(out.sum(), [q])
    assert dq.shape == q.shape and dq.is_contiguous()
