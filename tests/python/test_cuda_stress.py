"""fmha on CUDA under a serving process's conditions, through torch: forward + backward captured in
a CUDA graph (torch.cuda.graph) and replayed on new inputs, equal bit for bit to eager runs
(deterministic backward); out-of-memory raised as an exception, after which the same call runs.
Skipped without CUDA; scripts/gpu-check.sh runs this file in its stress step."""

from __future__ import annotations

import pytest
import torch

import fmha

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")


def _inputs(seed, b=2, lq=333, lk=301, h=4, hkv=2, d=64, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g).to("cuda", dtype)  # noqa: E731
    return make(b, lq, h, d), make(b, lk, hkv, d), make(b, lk, hkv, d), make(b, lq, h, d)


def _step(q, k, v, dout):
    """Forward and every input gradient: what the graph captures."""
    out = fmha.attention(q, k, v, causal=True, causal_alignment="bottom_right", deterministic=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out, dq, dk, dv


def _eager(seed):
    q, k, v, dout = _inputs(seed)
    with torch.no_grad():
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    return [x.detach() for x in _step(*leaves, dout)]


def test_graph_capture_and_replay_of_forward_and_backward():
    expected = {seed: _eager(seed) for seed in (1, 2)}
    q, k, v, dout = _inputs(1)
    static = [x.clone().requires_grad_(True) for x in (q, k, v)]
    static_dout = dout.clone()
    # Warm up on a side stream (torch's recipe: lazy initialisation stays out of the capture).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            _step(*static, static_dout)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _step(*static, static_dout)
    for replay, seed in enumerate((1, 2, 2, 1)):
        new = _inputs(seed)
        with torch.no_grad():
            for target, value in zip((*static, static_dout), new):
                target.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        for name, got, want in zip(("out", "dq", "dk", "dv"), captured, expected[seed]):
            assert torch.equal(got, want), f"replay {replay} (inputs {seed}): {name} differs from eager"


def test_out_of_memory_is_an_exception_and_the_next_call_runs():
    # The fused backward's fp32 dQ accumulator here (B H Lq D floats, 1.25 GiB) is more than fmha's
    # workspace pool keeps (1 GiB): with the device full, the backward must fail to allocate it.
    b, lq, h, d = 1, 32768, 80, 128
    tensor_bytes = b * lq * h * d * 2
    free, _ = torch.cuda.mem_get_info()
    if free < 12 * tensor_bytes + (4 << 30):
        pytest.skip("needs about 12 GiB of free device memory")
    q, k, v, dout = (torch.zeros(b, lq, h, d, device="cuda", dtype=torch.float16) for _ in range(4))
    leaves = [x.requires_grad_(True) for x in (q, k, v)]
    out = fmha.attention(*leaves, backward_impl="fused")
    hog = []
    try:
        # Fill the device in blocks of a gradient's size, then give three back to torch's cache:
        # dq, dk and dv fit there, fmha's own workspace does not.
        try:
            while True:
                hog.append(torch.empty(tensor_bytes, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            pass
        for chunk in (1 << 30, 1 << 26, 1 << 20):
            try:
                while True:
                    hog.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
            except torch.cuda.OutOfMemoryError:
                pass
        del hog[:3]
        with pytest.raises((RuntimeError, torch.cuda.OutOfMemoryError), match="memory"):
            torch.autograd.grad(out, leaves, dout, retain_graph=True)
            torch.cuda.synchronize()
    finally:
        hog.clear()
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    grads = torch.autograd.grad(out, leaves, dout)
    torch.cuda.synchronize()
    assert all(torch.isfinite(g).all() for g in grads)
    # And a small call, against its float64 CPU result.
    q, k, v, _ = _inputs(5, lq=77, lk=91)
    got = fmha.attention(q, k, v)
    want = fmha.attention(*(x.cpu().double() for x in (q, k, v)))
    assert torch.allclose(got.double().cpu(), want, atol=2e-3, rtol=2e-3)
