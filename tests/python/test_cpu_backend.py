"""The choice of the CPU backend (SPEC §18): fmha.set_cpu_backend / fmha.get_cpu_backend. "auto" runs
the fast CPU backend where it applies and "reference" the float64 reference; both agree with a
float64 computation, forward and backward, and differ from each other (different arithmetic)."""

from __future__ import annotations

import pytest
import torch

import fmha
from fmha import _cpu_threads


@pytest.fixture(autouse=True)
def _restore_backend():
    yield
    fmha.set_cpu_backend("auto")


def _run(q, k, v):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, lse = fmha.attention(q, k, v, causal=True, return_lse=True)
    (out.square().sum() + lse.sum()).backward()
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def test_default_is_auto_and_invalid_names_are_refused():
    assert fmha.get_cpu_backend() == "auto"
    with pytest.raises(ValueError, match="cpu backend 'fast'"):
        fmha.set_cpu_backend("fast")
    assert fmha.get_cpu_backend() == "auto"


def test_both_backends_match_float64_and_differ_from_each_other():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 70, 4, 40) for _ in range(3))
    exact = _run(q.double(), k.double(), v.double())  # float64 always runs on the reference
    fast = _run(q, k, v)
    fmha.set_cpu_backend("reference")
    assert fmha.get_cpu_backend() == "reference"
    reference = _run(q, k, v)
    for name, e, f, r in zip(("out", "lse", "dq", "dk", "dv"), exact, fast, reference):
        for got in (f, r):
            error = (got.double() - e).norm() / e.norm()
            assert error < 1e-5, f"{name}: relative error {error:.3g}"
    assert not torch.equal(fast[0], reference[0]), "auto ran the reference"


def test_fast_backend_follows_torch_threads_bitwise():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 150, 6, 40) for _ in range(3))
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(_run(q, k, v))
    finally:
        torch.set_num_threads(before)
    for name, one, two in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert torch.equal(one, two), f"{name} differs between 1 and 2 threads"


@pytest.mark.skipif(_cpu_threads._loaded_openmp() is None,
                    reason="no OpenMP runtime in this process (PyTorch built without one, or not Linux)")
def test_workers_on_torch_openmp_team_bitwise_like_own_threads():
    """The workers run on PyTorch's OpenMP team (taken when the PyTorch front end was imported) and
    on fmha's own threads with the same bits."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 150, 6, 40) for _ in range(3))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _cpu_threads.use_torch_openmp()
        on_team = _run(q, k, v)
        fmha._C.set_cpu_parallel_runtime(0, 0)  # fmha's own threads
        own = _run(q, k, v)
    finally:
        _cpu_threads.use_torch_openmp()
        torch.set_num_threads(before)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), on_team, own):
        assert torch.equal(a, b), f"{name} differs between the team and fmha's own threads"


def test_one_key_and_a_sink_in_bf16():
    """The API fuzzer's valid draw 276 (bf16, one key, sinks, causal bottom-right): a row's
    probability sits on the one key, so dP - Delta is a small difference, which the bf16 rounding of
    out would dominate were Delta taken as dout . out; the fast backend takes it from P dP there."""
    from test_fuzz import ValidDraw, _check_valid

    _check_valid(ValidDraw(276, "cpu"), "cpu", 276)


def _run_na(func, q, k, v, kernel, dilation, causal, sinks):
    q, k, v, sinks = (t.detach().clone().requires_grad_(True) for t in (q, k, v, sinks))
    out, lse = func(q, k, v, kernel, dilation, causal, sinks=sinks, return_lse=True)
    (out.square().sum() + lse.sum()).backward()
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad, sinks.grad


@pytest.mark.parametrize("func, grid, kernel, dilation, causal", [
    (fmha.na1d, (150,), 31, 2, False),
    (fmha.na2d, (13, 21), (5, 4), (2, 3), (False, True)),
    (fmha.na3d, (5, 9, 7), (3, 3, 2), (1, 2, 3), (True, False, False)),
])
def test_neighborhood_on_the_fast_backend(func, grid, kernel, dilation, causal):
    """NA 1-D / 2-D / 3-D with GQA and sinks: the fast backend (auto) against float64 at SPEC §13's
    fp32 tolerance, its bits not the reference's, and the same bits on 1 and 2 threads."""
    torch.manual_seed(2)
    q = torch.randn(2, *grid, 4, 40)
    k, v = (torch.randn(2, *grid, 2, 40) for _ in range(2))
    sinks = torch.randn(4)
    args = (kernel, dilation, causal)
    exact = _run_na(func, q.double(), k.double(), v.double(), *args, sinks)
    before = torch.get_num_threads()
    try:
        fast = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            fast.append(_run_na(func, q, k, v, *args, sinks))
    finally:
        torch.set_num_threads(before)
    fmha.set_cpu_backend("reference")
    reference = _run_na(func, q, k, v, *args, sinks)
    names = ("out", "lse", "dq", "dk", "dv", "dsinks")
    for name, e, one, two in zip(names, exact, *fast):
        error = (one.double() - e).norm() / e.norm()
        assert error < 1e-5, f"{name}: relative error {error:.3g}"
        assert torch.equal(one, two), f"{name} differs between 1 and 2 threads"
    assert not torch.equal(fast[0][0], reference[0]), "auto ran the reference"


def _run_extra(q, k, v, extra_k, extra_v, varlen):
    q, k, v, extra_k, extra_v = (t.detach().clone().requires_grad_(True)
                                 for t in (q, k, v, extra_k, extra_v))
    if varlen:
        cu_q = torch.tensor([0, 1, 70, 70], dtype=torch.int32)
        cu_k = torch.tensor([0, 90, 90, 150], dtype=torch.int32)
        out, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, 69, 90, causal=True, softcap=4.0,
                                         extra_kv=(extra_k, extra_v), return_lse=True)
    else:
        out, lse = fmha.attention(q, k, v, causal=True, softcap=4.0,
                                  extra_kv=(extra_k, extra_v), return_lse=True)
    (out.square().sum() + lse.sum()).backward()
    return (out.detach(), lse.detach(), q.grad, k.grad, v.grad, extra_k.grad, extra_v.grad)


@pytest.mark.parametrize("varlen", [False, True])
def test_extra_keys_on_the_fast_backend(varlen):
    """Extra keys (SPEC §7) with GQA, a causal mask and softcap, dense and varlen: the fast backend
    against float64 at SPEC §13's fp32 tolerance with their gradients, its bits not the
    reference's, the same bits on 1 and 2 threads."""
    torch.manual_seed(3)
    if varlen:
        q = torch.randn(70, 4, 40)
        k, v = (torch.randn(150, 2, 40) for _ in range(2))
        extra_k, extra_v = (torch.randn(3, 5, 2, 40) for _ in range(2))
    else:
        q = torch.randn(2, 70, 4, 40)
        k, v = (torch.randn(2, 90, 2, 40) for _ in range(2))
        extra_k, extra_v = (torch.randn(2, 5, 2, 40) for _ in range(2))
    inputs = (q, k, v, extra_k, extra_v)
    exact = _run_extra(*(t.double() for t in inputs), varlen)
    before = torch.get_num_threads()
    try:
        fast = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            fast.append(_run_extra(*inputs, varlen))
    finally:
        torch.set_num_threads(before)
    fmha.set_cpu_backend("reference")
    reference = _run_extra(*inputs, varlen)
    names = ("out", "lse", "dq", "dk", "dv", "dextra_k", "dextra_v")
    for name, e, one, two in zip(names, exact, *fast):
        error = (one.double() - e).norm() / e.norm()
        assert error < 1e-5, f"{name}: relative error {error:.3g}"
        assert torch.equal(one, two), f"{name} differs between 1 and 2 threads"
    assert not torch.equal(fast[0][0], reference[0]), "auto ran the reference"
