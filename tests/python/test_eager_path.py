"""The eager path (fmha._attention_ops.call): plain tensors skip torch's custom-op machinery and run
the ops' own forward and backward through an autograd.Function. It must give the op's results and
gradients bit for bit, keep its autograd contract (gradients only where asked, no double
backward), and leave the op in place wherever something observes ops (dispatch modes)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import fmha
from fmha import _api, _attention_ops as ops
from harness import DEVICES, WORKING_DTYPE as DTYPE, randn


def _inputs(device, shape_q, shape_kv, seed):
    q = randn(*shape_q, seed=seed).to(device, DTYPE[device]).requires_grad_()
    k = randn(*shape_kv, seed=seed + 1).to(device, DTYPE[device]).requires_grad_()
    v = randn(*shape_kv, seed=seed + 2).to(device, DTYPE[device]).requires_grad_()
    return q, k, v


def _run(op, eager: bool, q, k, v, layout_args, options, extra_grads=()):
    """out, lse and every gradient of one call, through the eager path or the op itself."""
    args = (*layout_args, *options)
    out, lse = ops.call(op, q, k, v, *args) if eager else op(q, k, v, *args)
    grads = torch.autograd.grad(
        out.float().square().sum() + lse.sum(), (q, k, v, *extra_grads), allow_unused=True
    )
    return out.detach(), lse.detach(), grads


def _assert_same(a, b):
    out_a, lse_a, grads_a = a
    out_b, lse_b, grads_b = b
    assert torch.equal(out_a, out_b) and torch.equal(lse_a, lse_b)
    for ga, gb in zip(grads_a, grads_b):
        assert (ga is None) == (gb is None)
        if ga is not None:
            assert torch.equal(ga, gb)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_path_gives_the_ops_bits(device):
    # Dense with a broadcast bias (its gradient too) and causal; varlen; 2-D neighborhood.
    q, k, v = _inputs(device, (2, 9, 4, 16), (2, 11, 2, 16), seed=1)
    bias = randn(4, 9, 11, seed=7).to(device, DTYPE[device]).requires_grad_()
    o = _api._options(None, True, "bottom_right", None, bias, None, 0.0, None, None, False,
                      "auto", False)  # fmt: skip
    assert ops._takes_eager_path(q)
    _assert_same(
        _run(ops.attention_fwd, True, q, k, v, (), o, (bias,)),
        _run(ops.attention_fwd, False, q, k, v, (), o, (bias,)),
    )

    qv, kv, vv = _inputs(device, (12, 2, 16), (12, 2, 16), seed=3)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    o = _api._options(None, True, "top_left", None, None, None, 0.0, None, None, False, "auto",
                      False)  # fmt: skip
    layout = (cu, cu, 7, 7, False)
    _assert_same(
        _run(ops.attention_varlen_fwd, True, qv, kv, vv, layout, o),
        _run(ops.attention_varlen_fwd, False, qv, kv, vv, layout, o),
    )

    qn, kn, vn = _inputs(device, (1, 6, 7, 2, 16), (1, 6, 7, 2, 16), seed=5)
    o = _api._options(None, False, "top_left", None, None, None, 0.0, None, None, False, "auto",
                      False)  # fmt: skip
    layout = ([3, 3], [1, 2], [False, True])
    _assert_same(
        _run(ops.neighborhood_fwd, True, qn, kn, vn, layout, o),
        _run(ops.neighborhood_fwd, False, qn, kn, vn, layout, o),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_eager_path_keeps_the_autograd_contract(device):
    q, k, v = _inputs(device, (1, 5, 2, 8), (1, 5, 2, 8), seed=11)
    out = fmha.attention(q, k.detach(), v, causal=True)
    assert out.grad_fn is not None
    gq, gv = torch.autograd.grad(out.sum(), (q, v), create_graph=True)
    # The backward is not differentiable again, as the op's backward has no autograd either.
    with pytest.raises(RuntimeError):
        torch.autograd.grad(gq.sum(), q)
    with torch.no_grad():
        assert fmha.attention(q, k, v).grad_fn is None


@pytest.mark.parametrize("device", DEVICES)
def test_public_function_with_every_optional_tensor_gives_the_ops_bits(device):
    # The public function hands its Options to the eager path whole; with optional tensors given,
    # they are the Function's inputs too, and their gradients must come back as the op's do.
    q, k, v = _inputs(device, (1, 7, 4, 16), (1, 9, 2, 16), seed=31)
    bias = randn(4, 1, 9, seed=32).to(device, DTYPE[device]).requires_grad_()
    sinks = randn(4, seed=33).to(device, torch.float32).requires_grad_()
    extra_k = randn(1, 3, 2, 16, seed=34).to(device, DTYPE[device]).requires_grad_()
    extra_v = randn(1, 3, 2, 16, seed=35).to(device, DTYPE[device])  # no gradient asked for
    kwargs = dict(causal=True, window=(4, 2), softcap=5.0, bias=bias, sinks=sinks,
                  extra_kv=(extra_k, extra_v), return_lse=True)  # fmt: skip
    inputs = (q, k, v, bias, sinks, extra_k)
    out, lse = fmha.attention(q, k, v, **kwargs)
    assert type(out.grad_fn).__name__ == "EagerBackward"
    grads = torch.autograd.grad(out.float().square().sum() + lse.sum(), inputs)
    o = _api._options(None, True, "top_left", (4, 2), bias, None, 5.0, sinks, (extra_k, extra_v),
                      False, "auto", False)  # fmt: skip
    expected = _run(ops.attention_fwd, False, q, k, v, (), o, (bias, sinks, extra_k))
    _assert_same((out.detach(), lse.detach(), grads), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_changes_to_saved_inputs_are_refused_as_by_the_op(device):
    # The eager Function keeps varlen's offsets (not one of its inputs) and the bias (one of
    # them) through save_for_backward, as the op does: changing either between forward and
    # backward is refused by autograd on both paths.
    q, k, v = _inputs(device, (12, 2, 16), (12, 2, 16), seed=41)
    o = _api._options(None, True, "top_left", None, None, None, 0.0, None, None, False, "auto",
                      False)  # fmt: skip
    for eager in (True, False):
        cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
        args = (cu, cu, 7, 7, False, *o)
        out, _ = ops.call(ops.attention_varlen_fwd, q, k, v, *args) if eager else \
            ops.attention_varlen_fwd(q, k, v, *args)  # fmt: skip
        cu.add_(0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(out.sum(), q)

    q, k, v = _inputs(device, (1, 5, 2, 8), (1, 5, 2, 8), seed=43)
    for eager in (True, False):
        bias = torch.zeros(1, 5, 5, device=device, dtype=DTYPE[device], requires_grad=True)
        o = _api._options(None, False, "top_left", None, bias.clone(), None, 0.0, None, None,
                          False, "auto", False)  # fmt: skip
        out, _ = ops.call(ops.attention_fwd, q, k, v, *o) if eager else \
            ops.attention_fwd(q, k, v, *o)  # fmt: skip
        with torch.no_grad():
            o.bias.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(out.sum(), q)


def test_dispatch_modes_see_the_op():
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v = (randn(1, 4, 2, 8, seed=s) for s in range(3))
    expected = fmha.attention(q, k, v)
    with Record():
        assert not ops._takes_eager_path(q)
        out = fmha.attention(q, k, v)
    assert any("fmha.attention_fwd" in name for name in seen), seen
    assert torch.equal(out, expected)
    # torch's infrastructure modes (fake tensors here) are on the dispatch stack that the eager
    # path reads, as user modes are.
    with FakeTensorMode():
        assert not ops._no_op_observers()
    assert ops._no_op_observers()


def test_tracing_records_the_op():
    q, k, v = (randn(1, 4, 2, 8, seed=s) for s in range(3))
    with pytest.warns(Warning):  # torch.jit.trace is deprecated; the trace still runs
        traced = torch.jit.trace(lambda q, k, v: fmha.attention(q, k, v), (q, k, v))
    assert "fmha::attention_fwd" in str(traced.graph)
    assert torch.equal(traced(q, k, v), fmha.attention(q, k, v))


@pytest.mark.parametrize("device", DEVICES)
def test_calls_without_gradients_skip_the_function(device):
    # No input requires grad, or grad mode is off: forward() runs without the autograd.Function,
    # with the same bits; an optional tensor that requires grad (sinks) still takes the Function.
    q, k, v = (x.detach() for x in _inputs(device, (1, 7, 4, 16), (1, 9, 2, 16), seed=21))
    expected, expected_lse = ops.attention_fwd(q, k, v, *_api._options(
        None, True, "bottom_right", None, None, None, 0.0, None, None, False, "auto", False))
    out, lse = fmha.attention(q, k, v, causal=True, causal_alignment="bottom_right",
                              return_lse=True)
    assert out.grad_fn is None and torch.equal(out, expected) and torch.equal(lse, expected_lse)
    sinks = torch.zeros(4, device=device, requires_grad=True)
    out = fmha.attention(q, k, v, sinks=sinks)
    assert out.grad_fn is not None
    (dsinks,) = torch.autograd.grad(out.float().sum(), sinks)
    assert dsinks.shape == (4,)
    with torch.no_grad():
        assert fmha.attention(q.requires_grad_(), k, v, sinks=sinks).grad_fn is None


def test_options_follow_the_cpu_backend_and_threads(monkeypatch):
    # The options of calls without optional tensors are reused between calls: a change of the CPU
    # backend or of torch's thread count must still reach the next call.
    seen = []
    monkeypatch.setattr(fmha._bridge, "run_shaped",
                        lambda params, device: seen.append((params.options.cpu_backend,
                                                            params.options.cpu_threads)))
    q = randn(1, 4, 2, 8, seed=3)
    threads = torch.get_num_threads()
    try:
        fmha.attention(q, q, q)
        fmha.set_cpu_backend("reference")
        fmha.attention(q, q, q)
        torch.set_num_threads(1)
        fmha.attention(q, q, q)
    finally:
        fmha.set_cpu_backend("auto")
        torch.set_num_threads(threads)
    auto, reference = fmha._C.CpuBackend.auto, fmha._C.CpuBackend.reference
    assert seen == [(auto, threads), (reference, threads), (reference, 1)]


def test_forward_mode_ad_is_refused_as_before():
    import torch.autograd.forward_ad as fwAD

    q = randn(1, 4, 2, 8, seed=4)
    with fwAD.dual_level():
        dual = fwAD.make_dual(q, torch.ones_like(q))
        with pytest.raises(NotImplementedError, match="jvp"):
            fmha.attention(dual, q, q)


@pytest.mark.parametrize("device", DEVICES)
def test_a_retained_graph_differentiates_twice_alike(device):
    # The first backward drops the views the forward kept for it; the second makes its own.
    q, k, v = _inputs(device, (1, 6, 2, 8), (1, 6, 2, 8), seed=12)
    out = fmha.attention(q, k, v, causal=True)
    dout = randn(*out.shape, seed=13).to(device=out.device, dtype=out.dtype)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    second = torch.autograd.grad(out, (q, k, v), dout)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def _exit_report(script: str) -> str:
    """stderr of a Python process that runs `script` and exits."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", "import torch, fmha\n" + script],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_a_graph_kept_after_its_backward_holds_no_object_of_the_extension():
    # The backward drops the views the forward kept for it: with nanobind's leak report on, a
    # script that keeps a differentiated output to its end reports nothing.
    stderr = _exit_report(
        "fmha._C.set_leak_warnings(True)\n"
        "q = torch.randn(1, 4, 2, 8, requires_grad=True)\n"
        "out = fmha.attention(q, q, q)\n"
        "out.sum().backward()\n"
    )
    assert "leaked" not in stderr, stderr


def test_a_script_ending_with_its_graph_alive_reports_no_leak():
    # A graph never differentiated still holds the forward's views at exit, past the extension's
    # teardown: nanobind's report, which would call them leaks, is off by default...
    script = "q = torch.randn(1, 4, 2, 8, requires_grad=True)\nkept = fmha.attention(q, q, q)\n"
    assert "leaked" not in _exit_report(script)
    # ... and says so when turned on, so the test above can see a view left behind.
    assert "leaked" in _exit_report("fmha._C.set_leak_warnings(True)\n" + script)
