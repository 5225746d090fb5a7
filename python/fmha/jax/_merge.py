"""merge_attentions (SPEC §12) as a jax.custom_vjp over the merge handlers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from . import _ffi

_STATIC = _ffi.Static()


def _forward(outs: tuple, lses: tuple):
    if not outs:
        _ffi.raise_for_status(1, "fmha: merge_attentions got no parts; expected at least one")
    values = _ffi.attrs(_STATIC, num_parts=len(outs))
    results = (
        jax.ShapeDtypeStruct(outs[0].shape, outs[0].dtype),
        jax.ShapeDtypeStruct(lses[0].shape, lses[0].dtype) if lses else
        jax.ShapeDtypeStruct((0,), jnp.float32),
    )  # fmt: skip
    out, lse = _ffi.call("merge_fwd", (*outs, *lses), results, values)
    return out, lse


@jax.custom_vjp
def merge(outs: tuple, lses: tuple):
    return _forward(outs, lses)


def _merge_fwd(outs, lses):
    outs, lses = tuple(x.value for x in outs), tuple(x.value for x in lses)
    out, lse = _forward(outs, lses)
    return (out, lse), (outs, lses, out, lse)


def _merge_bwd(residuals, cotangents):
    outs, lses, out, lse = residuals
    dout, dlse = cotangents
    if isinstance(dout, SymbolicZero):
        dout = jnp.zeros(out.shape, out.dtype)
    if isinstance(dlse, SymbolicZero):
        dlse = None
    values = _ffi.attrs(_STATIC, num_parts=len(outs), has_dlse=dlse is not None)
    args = (*outs, *lses, out, lse, dout, *(() if dlse is None else (dlse,)))
    results = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (*outs, *lses)]
    grads = _ffi.call("merge_bwd", args, results, values)
    return tuple(grads[: len(outs)]), tuple(grads[len(outs) :])


merge.defvjp(_merge_fwd, _merge_bwd, symbolic_zeros=True)
