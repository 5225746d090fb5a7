"""merge_attentions (SPEC §12) as a jax.custom_vjp over the merge handlers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from . import _batching, _ffi

_STATIC = _ffi.Static()


def _like(x) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _forward_call(num_parts: int):
    """outs[n], lses[n] -> (out, lse): shaped like the first part (the check refuses others)."""

    def call(*arrays):
        values = _ffi.attrs(_STATIC, num_parts=num_parts)
        results = (_like(arrays[0]), _like(arrays[num_parts]))
        return tuple(_ffi.call("merge_fwd", arrays, results, values))

    return _batching.folded(call)


def _backward_call(num_parts: int, has_dlse: bool):
    """outs[n], lses[n], out, lse, dout, [dlse] -> douts[n], dlses[n]."""

    def call(*arrays):
        values = _ffi.attrs(_STATIC, num_parts=num_parts, has_dlse=has_dlse)
        results = [_like(x) for x in arrays[: 2 * num_parts]]
        return tuple(_ffi.call("merge_bwd", arrays, results, values))

    return _batching.folded(call)


def _forward(outs: tuple, lses: tuple):
    if not outs or len(lses) != len(outs):
        _ffi.raise_for_status(
            1, f"fmha: merge_attentions got {len(outs)} outs and {len(lses)} lses; expected "
            "the same number of each, at least one",
        )  # fmt: skip
    out, lse = _forward_call(len(outs))(*outs, *lses)
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
    has_dlse = not isinstance(dlse, SymbolicZero)
    args = (*outs, *lses, out, lse, dout, *((dlse,) if has_dlse else ()))
    grads = _backward_call(len(outs), has_dlse)(*args)
    return tuple(grads[: len(outs)]), tuple(grads[len(outs) :])


merge.defvjp(_merge_fwd, _merge_bwd, symbolic_zeros=True)
