"""Forward and backward of dense, varlen and neighborhood attention as one jax.custom_vjp.

The custom_vjp takes, besides the static options, q, k, v, the layout's arrays (cu_seqlens for
varlen, none otherwise) and the six optional inputs (bias, rel_h, rel_w, sinks, extra_k, extra_v;
None when not given), already in the shapes the C++ layer reads (the public functions reshape
bias and broadcast rel-pos, so JAX's own VJPs of those steps return gradients in the user's
shapes). It returns (out, lse), both differentiable: dlse reaches the backward when lse is used.

symbolic_zeros=True lets the forward see which inputs are differentiated (CustomVJPPrimal.
perturbed): the backward computes only the optional gradients that are needed, and passes dlse
only when one flows in. Dense and neighborhood calls go through _batching, which folds a vmapped
axis into the batch.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from . import _batching, _ffi


class Layout(NamedTuple):
    name: str  # "attention", "varlen", "neighborhood": the handlers' prefix
    check_on_trace: bool  # False where the check reads values (varlen offsets)

    def lse_shape(self, q) -> tuple:
        if self.name == "varlen":  # [H, total_q]
            return (q.shape[1], q.shape[0]) if q.ndim == 3 else (0,)
        if self.name == "attention":  # [B, H, Lq]
            return (q.shape[0], q.shape[2], q.shape[1]) if q.ndim == 4 else (0,)
        # neighborhood: [B, H, X1, (X2, (X3))]
        return (q.shape[0], q.shape[-2], *q.shape[1:-2]) if q.ndim >= 3 else (0,)


DENSE = Layout("attention", True)
VARLEN = Layout("varlen", False)
NEIGHBORHOOD = Layout("neighborhood", True)


def _lse_dtype(q):
    # fp32 by contract; fp64 problems get an fp64 lse, so that checks by finite differences
    # through lse work (as in the PyTorch front end).
    return jnp.float64 if q.dtype == jnp.float64 else jnp.float32


def _mask(flags) -> int:
    return sum(1 << i for i, flag in enumerate(flags) if flag)


def forward(layout: Layout, static: _ffi.Static, q, k, v, layout_arrays, optional):
    out_shape = (*q.shape[:-1], v.shape[-1]) if q.ndim >= 1 and v.ndim >= 1 else (0,)
    results = (
        jax.ShapeDtypeStruct(out_shape, q.dtype),
        jax.ShapeDtypeStruct(layout.lse_shape(q), _lse_dtype(q)),
    )
    values = _ffi.attrs(static, inputs=_mask(x is not None for x in optional))
    args = (q, k, v, *layout_arrays, *(x for x in optional if x is not None))
    out, lse = _ffi.call(layout.name + "_fwd", args, results, values, check=layout.check_on_trace)
    return out, lse


def backward(layout: Layout, static: _ffi.Static, q, k, v, layout_arrays, optional, out, lse,
             dout, dlse, needs):  # fmt: skip
    """(dq, dk, dv, optional gradients: None where not needed). dlse may be None."""
    inputs = _mask(x is not None for x in optional)
    grads = _mask(x is not None and need for x, need in zip(optional, needs))
    values = _ffi.attrs(static, inputs=inputs, grads=grads, has_dlse=dlse is not None)
    args = (q, k, v, *layout_arrays, out, lse, dout, *(() if dlse is None else (dlse,)),
            *(x for x in optional if x is not None))  # fmt: skip
    wanted = [x for i, x in enumerate(optional) if grads >> i & 1]
    results = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v, *wanted)]
    computed = iter(_ffi.call(layout.name + "_bwd", args, results, values,
                              check=layout.check_on_trace))  # fmt: skip
    dq, dk, dv = next(computed), next(computed), next(computed)
    optional_grads = tuple(next(computed) if grads >> i & 1 else None for i in range(len(optional)))
    return dq, dk, dv, optional_grads


# ---- custom_vjp ----------------------------------------------------------------------------------


def _vmappable_forward(layout, static, q, k, v, layout_arrays, optional):
    if layout == VARLEN:
        return forward(layout, static, q, k, v, layout_arrays, optional)

    def call(q, k, v, optional):
        return forward(layout, static, q, k, v, (), optional)

    return _batching.forward(call, q, k, v, optional)


def _vmappable_backward(layout, static, q, k, v, layout_arrays, optional, out, lse, dout, dlse,
                        needs):  # fmt: skip
    if layout == VARLEN:
        return backward(layout, static, q, k, v, layout_arrays, optional, out, lse, dout, dlse,
                        needs)  # fmt: skip

    def call(q, k, v, optional, out, lse, dout, dlse, needs):
        return backward(layout, static, q, k, v, (), optional, out, lse, dout, dlse, needs)

    return _batching.backward(call, q, k, v, optional, out, lse, dout, dlse, needs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def attend(layout: Layout, static: _ffi.Static, q, k, v, layout_arrays, optional):
    return _vmappable_forward(layout, static, q, k, v, layout_arrays, optional)


def _value(x):
    return x.value if isinstance(x, jax.custom_derivatives.CustomVJPPrimal) else x


def _attend_fwd(layout, static, q, k, v, layout_arrays, optional):
    needs = tuple(x is not None and x.perturbed for x in optional)
    q, k, v = _value(q), _value(k), _value(v)
    layout_arrays = tuple(_value(x) for x in layout_arrays)
    optional = tuple(None if x is None else _value(x) for x in optional)
    out, lse = _vmappable_forward(layout, static, q, k, v, layout_arrays, optional)
    # `needs` is static: kept in the residuals' tree structure (None or an empty tuple).
    flags = tuple(() if need else None for need in needs)
    return (out, lse), (q, k, v, layout_arrays, optional, out, lse, flags)


def _attend_bwd(layout, static, residuals, cotangents):
    q, k, v, layout_arrays, optional, out, lse, flags = residuals
    needs = tuple(flag is not None for flag in flags)
    dout, dlse = cotangents
    if isinstance(dout, SymbolicZero):
        dout = jnp.zeros(out.shape, out.dtype)
    if isinstance(dlse, SymbolicZero):
        dlse = None
    dq, dk, dv, optional_grads = _vmappable_backward(
        layout, static, q, k, v, layout_arrays, optional, out, lse, dout, dlse, needs
    )
    return dq, dk, dv, tuple(None for _ in layout_arrays), optional_grads


attend.defvjp(_attend_fwd, _attend_bwd, symbolic_zeros=True)


# ---- Argument preparation shared by the public functions ------------------------------------------


def bias_4d(bias):
    """bias of rank <= 4 with leading size-1 axes up to rank 4: a reshape, which the C++ layer
    reads as a broadcast (stride 0 on size-1 axes); JAX's VJP of the reshape returns dbias in the
    bias's own shape."""
    if bias is None or bias.ndim >= 4:
        return bias
    return jnp.reshape(bias, (1,) * (4 - bias.ndim) + bias.shape)


def rel_full(rel, rows):
    """rel_h / rel_w broadcast to [*rows, X] (rows: the scores' [B, H, Lq]), so their gradient is
    computed dense and JAX sums it back to the input's shape. Small (X is Hk or Wk); a shape that
    does not broadcast goes to the C++ check as it is, which names it."""
    if rel is None or rows is None or rel.ndim == 0 or rel.ndim > 4:
        return rel
    full = (*rows, rel.shape[-1])
    try:
        jnp.broadcast_shapes(rel.shape, full)
    except ValueError:
        return rel
    return jnp.broadcast_to(rel, full) if rel.shape != full else rel


def score_rows(layout: Layout, q):
    if layout == DENSE and q.ndim == 4:
        return (q.shape[0], q.shape[2], q.shape[1])
    if layout == NEIGHBORHOOD and q.ndim >= 3:
        return (q.shape[0], q.shape[-2], math.prod(q.shape[1:-2]))
    return None
