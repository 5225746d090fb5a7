"""fmha for JAX: exact fused attention, forward and backward, on jax.Array through XLA's FFI.

The same functions as the PyTorch front end (SPEC §15), in JAX's conventions: jax.Array in,
jax.Array out, every option other than an array is a static Python value (under jax.jit, close
over it or mark it static). Gradients flow to every floating-point input through jax.custom_vjp
(lse included: a loss that uses lse sends dlse to the backward). Works under jax.jit, jax.grad
and jax.vmap. Importing this module never imports torch.

Example::

    import jax, jax.numpy as jnp
    import fmha.jax as fj

    B, L, H, D = 2, 1024, 8, 64
    q, k, v = (jax.random.normal(key, (B, L, H, D), jnp.bfloat16)
               for key in jax.random.split(jax.random.key(0), 3))
    out = jax.jit(lambda q, k, v: fj.attention(q, k, v, causal=True))(q, k, v)
    dq = jax.grad(lambda q: fj.attention(q, k, v, causal=True).astype(jnp.float32).sum())(q)

Errors: a call that breaks the contract raises while tracing (ValueError, TypeError for a dtype,
NotImplementedError for what a backend cannot run) with the C++ library's message; varlen offsets
are checked when the call runs (docs/jax.md).

Backends: CPU arrays run the fast CPU backend (dense and varlen in float32 / float16 / bfloat16)
and the float64 reference for everything else; cpu_backend="reference" runs the reference for
every call. CUDA arrays run the CUDA backend on XLA's stream (built with it; checked on an H200
by tests/python/test_jax_cuda.py).
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp

from .. import _arguments as _args
from . import _attention, _ffi, _merge
from ._attention import DENSE, NEIGHBORHOOD, VARLEN

__version__ = _ffi.version()
__all__ = ["attention", "attention_varlen", "na1d", "na2d", "na3d", "merge_attentions"]


# ---- Static arguments ----------------------------------------------------------------------------
# Read by the rules that the PyTorch front end follows too (fmha._arguments). A traced value is
# refused as it is: every option other than an array is part of the traced computation.

_TRACED = _args.Opaque((jax.core.Tracer,), " (a traced value: pass it as a static argument)")
_int = functools.partial(_args.to_int, opaque=_TRACED)
_bool = functools.partial(_args.to_bool, opaque=_TRACED)


def _array(x, name: str):
    if x is None:
        return None
    try:
        x = jnp.asarray(x)
    except (TypeError, ValueError):  # a string parses as a number or fails with ValueError
        raise TypeError(f"fmha: {name} must be an array, got {type(x).__name__}") from None
    _ffi.dtype_name(x, name)
    return x


def _static(*, scale=None, causal=False, causal_alignment="top_left", window=None, softcap=0.0,
            deterministic=False, allow_tf32=False, backward_impl="auto", cpu_backend="auto",
            **layout) -> _ffi.Static:  # fmt: skip
    scalars = _args.scalar_options(scale, causal, causal_alignment, window, softcap, deterministic,
                                   _TRACED)  # fmt: skip
    return _ffi.Static(
        *scalars,
        allow_tf32=_bool(allow_tf32, "allow_tf32"),
        cpu_reference=_args.choice(cpu_backend, "cpu_backend", _args.CPU_BACKENDS) == "reference",
        backward_impl=_args.choice(backward_impl, "backward_impl", _args.BACKWARD_IMPLS),
        **layout,
    )


def _optional_inputs(layout, q, bias, rel_pos, sinks, extra_kv) -> tuple:
    rel_h, rel_w, extra_k, extra_v = _args.split_pairs(rel_pos, extra_kv, "arrays")
    rows = _attention.score_rows(layout, q)
    return (
        _attention.bias_4d(_array(bias, "bias")),
        _attention.rel_full(_array(rel_h, "rel_h"), rows),
        _attention.rel_full(_array(rel_w, "rel_w"), rows),
        _array(sinks, "sinks"),
        _array(extra_k, "extra_k"),
        _array(extra_v, "extra_v"),
    )


def _result(out, lse, return_lse: bool):
    return (out, lse) if _bool(return_lse, "return_lse") else out


# ---- Public functions ----------------------------------------------------------------------------


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: Optional[tuple[int, int]] = None,
    bias: Optional[jax.Array] = None,
    rel_pos: Optional[tuple[jax.Array, jax.Array]] = None,
    softcap: float = 0.0,
    sinks: Optional[jax.Array] = None,
    extra_kv: Optional[tuple[jax.Array, jax.Array]] = None,
    return_lse: bool = False,
    deterministic: bool = False,
    backward_impl: str = "auto",
    allow_tf32: bool = False,
    cpu_backend: str = "auto",
) -> Union[jax.Array, tuple[jax.Array, jax.Array]]:
    """Exact attention: softmax(scale * q k^T [softcap] + bias + rel-pos, masked) v.

    q [B, Lq, H, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv] (H % Hkv == 0: GQA/MQA without
    copies). Returns out [B, Lq, H, Dv], and lse [B, H, Lq] (float32; float64 for float64
    inputs) with return_lse=True; lse is differentiable too.

    scale: default 1/sqrt(D). causal / causal_alignment ('top_left' or 'bottom_right') and
    window=(left, right) (-1 unbounded) mask keys; both may be given. bias: any shape that
    broadcasts to [B, H, Lq, Lk] (e.g. [H, Lq, Lk] or [1, H, 1, Lk]), never materialised; its
    gradient has its own shape. rel_pos=(rel_h [B, H, Lq, Hk], rel_w [B, H, Lq, Wk]) with
    Lk = Hk * Wk (broadcastable likewise). softcap > 0: s = softcap * tanh(s / softcap).
    sinks [H] float32: one extra logit per head. extra_kv=(extra_k [B, R, Hkv, D],
    extra_v [B, R, Hkv, Dv]): keys every query sees, unmasked, unbiased. deterministic:
    bitwise reproducible results. backward_impl: 'auto', 'fused' or 'split' (as in fmha.attention).
    allow_tf32: float32 inputs may use TF32 tensor cores. cpu_backend: 'auto' or 'reference'
    (the float64-accumulating reference for every CPU call).
    """
    static = _static(scale=scale, causal=causal, causal_alignment=causal_alignment, window=window,
                     softcap=softcap, deterministic=deterministic, allow_tf32=allow_tf32,
                     backward_impl=backward_impl, cpu_backend=cpu_backend)  # fmt: skip
    q, k, v = _array(q, "q"), _array(k, "k"), _array(v, "v")
    optional = _optional_inputs(DENSE, q, bias, rel_pos, sinks, extra_kv)
    out, lse = _attention.attend(DENSE, static, q, k, v, (), optional)
    return _result(out, lse, return_lse)


def attention_varlen(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: Optional[tuple[int, int]] = None,
    bias: Optional[jax.Array] = None,
    softcap: float = 0.0,
    sinks: Optional[jax.Array] = None,
    extra_kv: Optional[tuple[jax.Array, jax.Array]] = None,
    return_lse: bool = False,
    deterministic: bool = False,
    backward_impl: str = "auto",
    allow_tf32: bool = False,
    cpu_backend: str = "auto",
) -> Union[jax.Array, tuple[jax.Array, jax.Array]]:
    """Attention over a packed batch of variable-length sequences.

    q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]; cu_seqlens_q / cu_seqlens_k
    [B + 1] int32, ascending from 0: sequence b owns rows cu_seqlens[b] .. cu_seqlens[b + 1] - 1
    and sees only its own keys; masks use positions inside the sequence. max_seqlen_q /
    max_seqlen_k: static ints (the longest sequence). Returns out [total_q, H, Dv] and, with
    return_lse, lse [H, total_q]. Options as in attention(); bias broadcasts to
    [B, H, max_seqlen_q, max_seqlen_k]; extra_kv are per sequence [B, R, Hkv, *]. The offsets
    are checked when the call runs (on the CPU): invalid ones fail the computation with the
    library's message.
    """
    static = _static(scale=scale, causal=causal, causal_alignment=causal_alignment, window=window,
                     softcap=softcap, deterministic=deterministic, allow_tf32=allow_tf32,
                     backward_impl=backward_impl, cpu_backend=cpu_backend,
                     max_seqlen_q=_int(max_seqlen_q, "max_seqlen_q"),
                     max_seqlen_k=_int(max_seqlen_k, "max_seqlen_k"))  # fmt: skip
    q, k, v = _array(q, "q"), _array(k, "k"), _array(v, "v")
    offsets = (_array(cu_seqlens_q, "cu_seqlens_q"), _array(cu_seqlens_k, "cu_seqlens_k"))
    optional = _optional_inputs(VARLEN, q, bias, None, sinks, extra_kv)
    out, lse = _attention.attend(VARLEN, static, q, k, v, offsets, optional)
    return _result(out, lse, return_lse)


def _neighborhood(num_dims, q, k, v, kernel_size, dilation, is_causal, scale, extra_kv, sinks,
                  return_lse, backward_impl, cpu_backend):  # fmt: skip
    static = _static(scale=scale, backward_impl=backward_impl, cpu_backend=cpu_backend,
                     kernel_size=_args.per_axis(kernel_size, num_dims, "kernel_size", _int),
                     dilation=_args.per_axis(dilation, num_dims, "dilation", _int),
                     na_causal=_args.per_axis(is_causal, num_dims, "is_causal", _bool))  # fmt: skip
    q, k, v = _array(q, "q"), _array(k, "k"), _array(v, "v")
    optional = _optional_inputs(NEIGHBORHOOD, q, None, None, sinks, extra_kv)
    out, lse = _attention.attend(NEIGHBORHOOD, static, q, k, v, (), optional)
    return _result(out, lse, return_lse)


_NA_DOC = """Neighborhood attention over a {n}-D token grid (SPEC §6).

    q [B, {grid}, H, D], k [B, {grid}, Hkv, D], v [B, {grid}, Hkv, Dv]. Each query sees the
    kernel_size keys around it on every axis (the window shifts inward at borders), spaced by
    dilation; is_causal=True sees only the kernel_size keys up to and including itself on that
    axis. kernel_size / dilation / is_causal: one static value for every axis or a tuple of {n}.
    scale, extra_kv, sinks, backward_impl and cpu_backend as in attention(). Returns
    out [B, {grid}, H, Dv] and, with return_lse, lse [B, H, {grid}].
    """


def na1d(q, k, v, kernel_size, dilation=1, is_causal=False, *, scale=None, extra_kv=None,
         sinks=None, return_lse=False, backward_impl="auto", cpu_backend="auto"):  # fmt: skip
    return _neighborhood(1, q, k, v, kernel_size, dilation, is_causal, scale, extra_kv, sinks,
                         return_lse, backward_impl, cpu_backend)  # fmt: skip


def na2d(q, k, v, kernel_size, dilation=1, is_causal=False, *, scale=None, extra_kv=None,
         sinks=None, return_lse=False, backward_impl="auto", cpu_backend="auto"):  # fmt: skip
    return _neighborhood(2, q, k, v, kernel_size, dilation, is_causal, scale, extra_kv, sinks,
                         return_lse, backward_impl, cpu_backend)  # fmt: skip


def na3d(q, k, v, kernel_size, dilation=1, is_causal=False, *, scale=None, extra_kv=None,
         sinks=None, return_lse=False, backward_impl="auto", cpu_backend="auto"):  # fmt: skip
    return _neighborhood(3, q, k, v, kernel_size, dilation, is_causal, scale, extra_kv, sinks,
                         return_lse, backward_impl, cpu_backend)  # fmt: skip


na1d.__doc__ = _NA_DOC.format(n=1, grid="X")
na2d.__doc__ = _NA_DOC.format(n=2, grid="X1, X2")
na3d.__doc__ = _NA_DOC.format(n=3, grid="X1, X2, X3")


def merge_attentions(outs: Sequence[jax.Array], lses: Sequence[jax.Array]):
    """Merges attentions of the same queries over disjoint key sets (SPEC §12).

    outs: parts [B, Lq, H, Dv] (all one dtype), lses: their [B, H, Lq] float32 log-sum-exps,
    e.g. from attention(..., return_lse=True). Returns (out, lse) of attention over the union of
    the keys; differentiable in every part. Apply sinks in exactly one part.
    """
    _args.merge_parts(outs, lses, "arrays")
    out_parts = tuple(_array(t, f"outs[{i}]") for i, t in enumerate(outs))
    lse_parts = tuple(_array(t, f"lses[{i}]") for i, t in enumerate(lses))
    return _merge.merge(out_parts, lse_parts)
