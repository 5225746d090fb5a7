"""torch.compile(fullgraph=True) of modules using each function (no graph breaks; same values and
gradients as eager), and torch.library.opcheck of every custom op."""

from __future__ import annotations

import pytest
import torch

import fmha
import fmha._attention_ops  # noqa: F401  (registers the ops)
from harness import DEVICES, WORKING_DTYPE, call

torch._dynamo.config.cache_size_limit = 64


def _inputs(device, *shapes, seed=0):  # sinks among them are cast to float32 where used
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=generator).to(device, WORKING_DTYPE[device]).requires_grad_(True)
            for s in shapes]  # fmt: skip


def _dense(q, k, v, bias, rel_h, rel_w, sinks, extra_k, extra_v):
    out, lse = fmha.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                              causal_alignment="bottom_right", window=(5, 1), bias=bias,
                              rel_pos=(rel_h, rel_w), softcap=3.0, sinks=sinks.float(),
                              extra_kv=(extra_k, extra_v), return_lse=True)  # fmt: skip
    return out.sum(dim=2) * 2, lse


def _varlen(q, k, v, bias, sinks):
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device=q.device)
    return fmha.attention_varlen(q, k, v, cu, cu, 5, 5, causal=True, bias=bias, sinks=sinks.float(),
                                 return_lse=True)  # fmt: skip


def _na1d(q, k, v):
    return fmha.na1d(q, k, v, 3, 2, True, return_lse=True)


def _na2d(q, k, v, extra_k, extra_v):
    return fmha.na2d(q, k, v, (3, 3), 1, (True, False), extra_kv=(extra_k, extra_v),
                     return_lse=True)  # fmt: skip


def _na3d(q, k, v):
    return fmha.na3d(q, k, v, 3, return_lse=True)


def _merge(q, k, v):
    a = fmha.attention(q, k[:, :3], v[:, :3], return_lse=True)
    b = fmha.attention(q, k[:, 3:], v[:, 3:], return_lse=True)
    return fmha.merge_attentions([a[0], b[0]], [a[1], b[1]])


B, H, L, D = 2, 4, 8, 8
FUNCTIONS = {
    "attention": (_dense, [(B, H, L, D), (B, 2, L, D), (B, 2, L, D), (H, L, L), (B, H, L, 2),
                           (B, H, L, 4), (H,), (B, 2, 2, D), (B, 2, 2, D)]),
    "attention_varlen": (_varlen, [(8, H, D), (8, 2, D), (8, 2, D), (1, H, 5, 5), (H,)]),
    "na1d": (_na1d, [(B, 9, H, D)] * 3),
    "na2d": (_na2d, [(B, 4, 5, H, D)] * 3 + [(B, 2, H, D)] * 2),
    "na3d": (_na3d, [(1, 3, 3, 4, 2, D)] * 3),
    "merge_attentions": (_merge, [(B, L, H, D), (B, 7, H, D), (B, 7, H, D)]),
}  # fmt: skip


class _Module(torch.nn.Module):
    """A small module around one fmha function, as a model would use it."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs):
        return self.fn(*inputs)


def _run_with_grads(fn, inputs):
    out, lse = fn(*inputs)
    loss = out.square().sum() + torch.where(torch.isfinite(lse), lse, 0).sum()
    return [out, lse, *torch.autograd.grad(loss, inputs)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_compiles_fullgraph_and_matches_eager(name, device):
    fn, shapes = FUNCTIONS[name]
    inputs = _inputs(device, *shapes)
    eager = call(device, _run_with_grads, fn, inputs)
    torch._dynamo.reset()
    compiled = torch.compile(_Module(fn), fullgraph=True, backend="aot_eager")
    results = _run_with_grads(compiled, inputs)
    for e, c in zip(eager, results):
        if device == "cpu":
            torch.testing.assert_close(c, e, rtol=0, atol=0)
        else:  # the CUDA backward accumulates dq with atomics: equal up to summation order
            torch.testing.assert_close(c, e)


def test_compiles_with_inductor():
    # The default backend too (inductor generates code around the opaque custom ops).
    fn, shapes = FUNCTIONS["attention"]
    inputs = _inputs("cpu", *shapes)
    eager = _run_with_grads(fn, inputs)
    torch._dynamo.reset()
    results = _run_with_grads(torch.compile(_Module(fn), fullgraph=True), inputs)
    for e, c in zip(eager, results):
        torch.testing.assert_close(c, e, rtol=1e-6, atol=1e-6)


# ---- opcheck: schema, fake kernels, autograd registration, AOT dispatch (static and dynamic) ----

_OPTIONS_NONE = [None] * 6 + [None, 0.0, False, False, -1, -1, False, "auto", False]


def _options(bias=None, rel_h=None, rel_w=None, sinks=None, extra_k=None, extra_v=None, scale=None,
             softcap=0.0, causal=False, bottom_right=False, window=(-1, -1)):  # fmt: skip
    return [bias, rel_h, rel_w, sinks, extra_k, extra_v, scale, softcap, causal, bottom_right,
            *window, False, "auto", False]  # fmt: skip


def _t(*shape, dtype=torch.float64, grad=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=dtype).requires_grad_(grad)


def _opcheck_cases():
    ops = torch.ops.fmha
    q, k, v = _t(2, 5, 4, 8, seed=1), _t(2, 6, 2, 8, seed=2), _t(2, 6, 2, 8, seed=3)
    dense_opts = _options(bias=_t(4, 1, 6, seed=4), rel_h=_t(2, 4, 5, 2, seed=5),
                          rel_w=_t(2, 4, 5, 3, seed=6), sinks=_t(4, seed=7),
                          extra_k=_t(2, 2, 2, 8, seed=8), extra_v=_t(2, 2, 2, 8, seed=9),
                          scale=0.4, softcap=2.0, causal=True, bottom_right=True, window=(3, 2))  # fmt: skip
    out, lse = ops.attention_fwd(q, k, v, *dense_opts)
    cases = {
        "attention_fwd": (ops.attention_fwd.default, (q, k, v, *dense_opts)),
        "attention_bwd": (ops.attention_bwd.default,
                          (_t(*out.shape, grad=False), _t(*lse.shape, grad=False), *(x.detach() for x in (q, k, v, out, lse)),
                           [True] * 6, *(x.detach() if isinstance(x, torch.Tensor) else x for x in dense_opts))),
    }  # fmt: skip
    vq, vk = _t(9, 4, 8, seed=10), _t(11, 2, 8, seed=11)
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 11], dtype=torch.int32)
    var_opts = _options(bias=_t(4, 5, 6, seed=12), sinks=_t(4, seed=13), causal=True)
    vout, vlse = ops.attention_varlen_fwd(vq, vk, vk, cu_q, cu_k, 5, 6, False, *var_opts)
    cases["attention_varlen_fwd"] = (ops.attention_varlen_fwd.default, (vq, vk, vk, cu_q, cu_k, 5, 6, False, *var_opts))
    cases["attention_varlen_bwd"] = (
        ops.attention_varlen_bwd.default,
        (_t(*vout.shape, grad=False), None, *(x.detach() for x in (vq, vk, vk, vout, vlse)), cu_q, cu_k, 5, 6, False,
         [True] * 6, *(x.detach() if isinstance(x, torch.Tensor) else x for x in var_opts)))  # fmt: skip
    nq = _t(1, 4, 5, 2, 8, seed=14)
    na_args = ([3, 2], [1, 2], [True, False])
    na_opts = _options(extra_k=_t(1, 1, 2, 8, seed=15), extra_v=_t(1, 1, 2, 8, seed=16))
    nout, nlse = ops.neighborhood_fwd(nq, nq, nq, *na_args, *na_opts)
    cases["neighborhood_fwd"] = (ops.neighborhood_fwd.default, (nq, nq, nq, *na_args, *na_opts))
    cases["neighborhood_bwd"] = (
        ops.neighborhood_bwd.default,
        (_t(*nout.shape, grad=False), _t(*nlse.shape, grad=False), *(x.detach() for x in (nq, nq, nq, nout, nlse)),
         *na_args, [True] * 6, *(x.detach() if isinstance(x, torch.Tensor) else x for x in na_opts)))  # fmt: skip
    parts = [_t(2, 3, 2, 4, seed=17), _t(2, 3, 2, 4, seed=18)]
    part_lses = [_t(2, 2, 3, seed=19), _t(2, 2, 3, seed=20)]
    mout, mlse = ops.merge_fwd(parts, part_lses)
    cases["merge_fwd"] = (ops.merge_fwd.default, (parts, part_lses))
    cases["merge_bwd"] = (ops.merge_bwd.default,
                          (_t(*mout.shape, grad=False), _t(*mlse.shape, grad=False),
                           [p.detach() for p in parts], [p.detach() for p in part_lses], mout.detach(), mlse.detach()))  # fmt: skip
    return cases


_OPCHECK_NAMES = ["attention_fwd", "attention_bwd", "attention_varlen_fwd", "attention_varlen_bwd",
                  "neighborhood_fwd", "neighborhood_bwd", "merge_fwd", "merge_bwd"]  # fmt: skip


@pytest.fixture(scope="module")
def opcheck_cases():
    return _opcheck_cases()


@pytest.mark.parametrize("name", _OPCHECK_NAMES)
def test_opcheck(name, opcheck_cases):
    op, args = opcheck_cases[name]
    torch.library.opcheck(op, args)
