"""The arguments of the public functions that are not tensors, read once for every front end.

The PyTorch functions (fmha._api, fmha._kv_cache, fmha.distributed) and the JAX ones (fmha.jax)
take the same scalar, string and tuple arguments (SPEC §15); this module turns them into the plain
values both pass on, and refuses what they cannot be with a message that names the argument
(SPEC §14). Everything about tensors and every check of a value against the problem or a range
(head counts, the default scale 1/sqrt(D), window bounds, softcap >= 0) belongs to the C++ layer,
which both front ends call. This module imports neither torch nor jax: `import fmha.jax` must not
load torch, nor `import fmha` jax.

A front end may name types that a scalar argument must never be converted from (`Opaque`): JAX's
tracers, whose conversion fails with JAX's own message or would fix a traced value into the
computation; they are refused with a hint appended to the message.
"""

from __future__ import annotations

import operator
from typing import NamedTuple, Sequence

ALIGNMENTS = ("top_left", "bottom_right")
BACKWARD_IMPLS = ("auto", "fused", "split")
CPU_BACKENDS = ("auto", "reference")

_INT64 = (-(1 << 63), (1 << 63) - 1)


class Opaque(NamedTuple):
    """Types a scalar argument is refused as, without trying to convert it, and what the refusal
    adds to its message."""

    types: tuple = ()
    hint: str = ""


NOTHING_OPAQUE = Opaque()


def shown(value) -> str:
    """A value for a message: its repr, cut short (a tensor's or a tracer's would be long)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def refused(value, name: str, accepted: str, opaque: Opaque = NOTHING_OPAQUE) -> TypeError:
    hint = opaque.hint if isinstance(value, opaque.types) else ""
    return TypeError(
        f"fmha: {name} is {shown(value)} ({type(value).__name__}){hint}; accepted: {accepted}"
    )


# Plain Python values take the first branch of each converter (which torch.compile traces as it
# is, and which keeps a call's host time short); anything else (numpy scalars, one-element tensors
# or arrays) converts as Python would, and what does not convert is refused with the argument's
# name rather than Python's own message.


def to_int(value, name: str, opaque: Opaque = NOTHING_OPAQUE) -> int:
    """An integer argument that fits the C++ layer's int64."""
    if isinstance(value, int):
        result = int(value)
    elif isinstance(value, opaque.types):
        raise refused(value, name, "an int", opaque)
    else:
        try:
            result = operator.index(value)
        except TypeError:
            raise refused(value, name, "an int", opaque) from None
    if not _INT64[0] <= result <= _INT64[1]:
        raise ValueError(f"fmha: {name} = {result} does not fit in a signed 64-bit integer")
    return result


def to_float(value, name: str, opaque: Opaque = NOTHING_OPAQUE) -> float:
    """A float argument; strings are refused (float() would parse them)."""
    if type(value) is float:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    return _converted(value, name, float, "a float", opaque)


def to_bool(value, name: str, opaque: Opaque = NOTHING_OPAQUE) -> bool:
    """A flag; strings are refused: their truth value ("False" is true) is never what was meant."""
    if value is True or value is False:
        return value
    if isinstance(value, (bool, int)) or value is None:
        return bool(value)
    return _converted(value, name, bool, "a bool", opaque)


def _converted(value, name: str, convert, what: str, opaque: Opaque):
    """convert(value) for any other object that converts (a numpy scalar, a 0-d tensor), strings
    and the front end's opaque values (tracers) refused."""
    if not isinstance(value, (str, bytes, *opaque.types)):
        try:
            return convert(value)
        except (TypeError, ValueError, RuntimeError):
            pass
    raise refused(value, name, what, opaque)


def pair(value, name: str, what: str) -> tuple:
    """A pair argument (window, rel_pos, extra_kv); what: the accepted pair, for the message."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"fmha: {name} is {value!r}; accepted: None or a pair {what}")
    return tuple(value)


def choice(value, name: str, accepted: Sequence[str]) -> str:
    """One of a few names (causal_alignment, backward_impl, cpu_backend)."""
    if value not in accepted:
        names = ", ".join(repr(a) for a in accepted)
        raise ValueError(f"fmha: {name} is {value!r}; accepted: {names}")
    return value


def window_bounds(value, opaque: Opaque = NOTHING_OPAQUE) -> tuple:
    """(window_left, window_right) of a window argument: None is (-1, -1), unbounded both ways.
    The C++ layer checks the values (each >= 0 or -1)."""
    if value is None:
        return -1, -1
    left, right = pair(value, "window", "(left, right) of ints, each >= 0 or -1 for unbounded")
    return to_int(left, "window[0]", opaque), to_int(right, "window[1]", opaque)


def scalar_options(scale, causal, causal_alignment, window, softcap, deterministic,
                   opaque: Opaque = NOTHING_OPAQUE) -> tuple:  # fmt: skip
    """(scale, softcap, causal, bottom_right, window_left, window_right, deterministic): the
    scalar options of every attention entry point, normalised, in the order of the fields that
    the PyTorch ops' Options and fmha.jax's Static begin with. scale None: 1/sqrt(D), which the
    C++ layer computes."""
    choice(causal_alignment, "causal_alignment", ALIGNMENTS)
    # No call for the common case, no window: this runs on the host path of every call.
    window_left, window_right = (-1, -1) if window is None else window_bounds(window, opaque)
    return (
        None if scale is None else to_float(scale, "scale", opaque),
        to_float(softcap, "softcap", opaque),
        to_bool(causal, "causal", opaque),
        causal_alignment == "bottom_right",
        window_left,
        window_right,
        to_bool(deterministic, "deterministic", opaque),
    )


def per_axis(value, num_dims: int, name: str, convert) -> tuple:
    """An int/bool for every axis of a naNd call, or one per axis; convert(x, name) reads each."""
    if isinstance(value, (tuple, list)):
        if len(value) != num_dims:
            raise ValueError(
                f"fmha: {name} is {tuple(value)!r} with {len(value)} entries; na{num_dims}d "
                f"accepts one value for all axes or a tuple of {num_dims}"
            )
        return tuple(convert(x, f"{name}[{i}]") for i, x in enumerate(value))
    return (convert(value, name),) * num_dims


def split_pairs(rel_pos, extra_kv, kind: str) -> tuple:
    """(rel_h, rel_w, extra_k, extra_v) of the rel_pos and extra_kv pairs, None where not given;
    kind: what the pairs hold ('tensors', 'arrays')."""
    rel_h = rel_w = extra_k = extra_v = None
    if rel_pos is not None:
        rel_h, rel_w = pair(rel_pos, "rel_pos", f"(rel_h, rel_w) of {kind}")
    if extra_kv is not None:
        extra_k, extra_v = pair(extra_kv, "extra_kv", f"(extra_k, extra_v) of {kind}")
    return rel_h, rel_w, extra_k, extra_v


def merge_parts(outs, lses, kind: str) -> None:
    """merge_attentions takes two lists; kind: what they hold ('tensors', 'arrays')."""
    if not isinstance(outs, (list, tuple)) or not isinstance(lses, (list, tuple)):
        raise TypeError(
            f"fmha: outs and lses must be lists of {kind}, got {type(outs).__name__} and "
            f"{type(lses).__name__}"
        )
