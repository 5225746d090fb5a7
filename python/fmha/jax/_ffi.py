"""Calls of the XLA FFI handlers of fmha._jax_ffi (python/src/jax/), and their trace-time check.

Each call passes its operands in the order python/src/jax/calls.h describes, and every attribute
that python/src/jax/attrs.h reads. Before a call is staged, the C++ validation runs on the
operands' shapes and dtypes (check()), so an invalid call is refused while tracing, under jit
too, with the library's message as a Python exception (mapped as in the PyTorch front end):

    invalid argument  -> TypeError when the message is about a dtype, ValueError otherwise
    not supported     -> NotImplementedError
    backend error     -> RuntimeError

Varlen calls are the exception: their check reads the offsets (cu_seqlens), which exist only
when the call runs; the handler refuses invalid ones then, and the error arrives as the
JaxRuntimeError of the computation, carrying the same message.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import jax
import numpy as np

try:
    from .. import _jax_ffi
except ImportError as error:
    raise ImportError(
        "fmha.jax needs the extension fmha._jax_ffi, which this build of fmha does not have: it is "
        "built when the Python that builds fmha imports jax (pip install jax, then pip install "
        "--no-build-isolation .); see docs/jax.md"
    ) from error

_TARGET_PREFIX = "fmha_"
_STATUS_OK, _STATUS_INVALID, _STATUS_NOT_SUPPORTED = 0, 1, 2

# Bits of the optional inputs (OptionalInput in calls.h), in operand order.
OPTIONAL_INPUTS = ("bias", "rel_h", "rel_w", "sinks", "extra_k", "extra_v")
_BACKWARD_IMPLS = {"auto": 0, "fused": 1, "split": 2}
_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32")


def version() -> str:
    return _jax_ffi.version()


def _register() -> None:
    for name, capsule in _jax_ffi.registrations(cuda=False).items():
        jax.ffi.register_ffi_target(_TARGET_PREFIX + name, capsule, platform="cpu")
    if _jax_ffi.built_with_cuda():
        # tests/python/test_jax_cuda.py runs them on a GPU.
        for name, capsule in _jax_ffi.registrations(cuda=True).items():
            jax.ffi.register_ffi_target(_TARGET_PREFIX + name, capsule, platform="CUDA")


_register()


class Static(NamedTuple):
    """The options of a call that are not arrays: hashable, part of the traced computation."""

    scale: Optional[float] = None
    softcap: float = 0.0
    causal: bool = False
    bottom_right: bool = False
    window_left: int = -1
    window_right: int = -1
    deterministic: bool = False
    allow_tf32: bool = False
    cpu_reference: bool = False
    backward_impl: str = "auto"
    max_seqlen_q: int = 0  # varlen
    max_seqlen_k: int = 0
    kernel_size: tuple = ()  # neighborhood: one entry per axis
    dilation: tuple = ()
    na_causal: tuple = ()


def _padded(values: Sequence[int]) -> tuple:
    return tuple(int(x) for x in (*values, 1, 1, 1)[:3])


def attrs(static: Static, inputs: int = 0, grads: int = 0, has_dlse: bool = False,
          num_parts: int = 0) -> dict:  # fmt: skip
    """Every attribute the handlers read, as plain Python values."""
    return {
        "inputs": inputs,
        "grads": grads,
        "has_dlse": int(has_dlse),
        "has_scale": int(static.scale is not None),
        "scale": 0.0 if static.scale is None else float(static.scale),
        "softcap": float(static.softcap),
        "causal": int(static.causal),
        "bottom_right": int(static.bottom_right),
        "window_left": int(static.window_left),
        "window_right": int(static.window_right),
        "deterministic": int(static.deterministic),
        "allow_tf32": int(static.allow_tf32),
        "cpu_reference": int(static.cpu_reference),
        "backward_impl": _BACKWARD_IMPLS[static.backward_impl],
        "max_seqlen_q": int(static.max_seqlen_q),
        "max_seqlen_k": int(static.max_seqlen_k),
        "na_dims": len(static.kernel_size),
        "kernel_size": _padded(static.kernel_size),
        "dilation": _padded(static.dilation),
        "na_causal": tuple(int(bool(c)) for c in (*static.na_causal, 0, 0, 0)[:3]),
        "num_parts": int(num_parts),
    }


def _ffi_attrs(values: dict) -> dict:
    """The attributes as the FFI decodes them: int64 scalars, float32 scalars, int64 arrays."""
    out = {}
    for name, value in values.items():
        if isinstance(value, tuple):
            out[name] = np.asarray(value, dtype=np.int64)
        elif isinstance(value, float):
            out[name] = np.float32(value)
        else:
            out[name] = np.int64(value)
    return out


def raise_for_status(code: int, message: str) -> None:
    if code == _STATUS_OK:
        return
    if code == _STATUS_INVALID:
        raise (TypeError if "dtype" in message else ValueError)(message)
    if code == _STATUS_NOT_SUPPORTED:
        raise NotImplementedError(message)
    raise RuntimeError(message)


def dtype_name(x, name: str) -> str:
    dtype = str(x.dtype)
    if dtype not in _DTYPES:
        raise TypeError(
            f"fmha: {name} has dtype {dtype}; accepted: float32, float16, bfloat16 "
            "(float64 on the CPU backend), int32 for cu_seqlens"
        )
    return dtype


def _described(arrays) -> list:
    return [(str(np.dtype(a.dtype)), tuple(int(s) for s in a.shape)) for a in arrays]


def call(entry: str, args: Sequence, results: Sequence[jax.ShapeDtypeStruct], values: dict,
         *, check: bool = True):  # fmt: skip
    """Checks the call on its shapes (unless check=False), then stages the handler's call."""
    if check:
        raise_for_status(*_jax_ffi.check(entry, _described(args), _described(results), values))
    # Under vmap each element runs as its own call (a loop); dense and neighborhood calls fold
    # the vmapped axis into the batch before they get here (_batching.py).
    return jax.ffi.ffi_call(_TARGET_PREFIX + entry, list(results), vmap_method="sequential")(
        *args, **_ffi_attrs(values)
    )
