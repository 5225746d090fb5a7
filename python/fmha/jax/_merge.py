"""merge_attentions (SPEC §12) as a jax.custom_vjp over the merge handlers."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from . import _batching, _ffi

_STATIC = _ffi.Static()


def _call(entry: str, arrays: tuple, like: Sequence[int], **attrs) -> tuple:
    """The handler `entry` on arrays, its results shaped like arrays[i] for i in like. Every
    operand and result has the batch first and nothing is summed over it, so under vmap all are
    folded into the batch (_batching.folded)."""
    values = _ffi.attrs(_STATIC, **attrs)

    def call(*arrays):
        results = [jax.ShapeDtypeStruct(arrays[i].shape, arrays[i].dtype) for i in like]
        return tuple(_ffi.call(entry, arrays, results, values))

    return _batching.folded(call)(*arrays)


def _forward(outs: tuple, lses: tuple):
    """outs[n], lses[n] -> (out, lse), shaped like the first part (the check refuses others)."""
    n = len(outs)
    if not outs or len(lses) != n:
        raise ValueError(
            f"fmha: merge_attentions got {n} outs and {len(lses)} lses; expected the same number "
            "of each, at least one"
        )
    return _call("merge_fwd", (*outs, *lses), (0, n), num_parts=n)


@jax.custom_vjp
def merge(outs: tuple, lses: tuple):
    return _forward(outs, lses)


def _merge_fwd(outs, lses):
    outs, lses = tuple(x.value for x in outs), tuple(x.value for x in lses)
    out, lse = _forward(outs, lses)
    return (out, lse), (outs, lses, out, lse)


def _merge_bwd(residuals, cotangents):
    """outs[n], lses[n], out, lse, dout, [dlse] -> douts[n], dlses[n]."""
    outs, lses, out, lse = residuals
    dout, dlse = cotangents
    if isinstance(dout, SymbolicZero):
        dout = jnp.zeros(out.shape, out.dtype)
    has_dlse = not isinstance(dlse, SymbolicZero)
    n = len(outs)
    args = (*outs, *lses, out, lse, dout, *((dlse,) if has_dlse else ()))
    grads = _call("merge_bwd", args, range(2 * n), num_parts=n, has_dlse=has_dlse)
    return grads[:n], grads[n:]


merge.defvjp(_merge_fwd, _merge_bwd, symbolic_zeros=True)
