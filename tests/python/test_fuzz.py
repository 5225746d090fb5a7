"""Fuzzing the Python API: random argument sets through fmha.attention, attention_varlen, na1d /
na2d / na3d and merge_attentions, drawn from a seed so that any draw replays alone.

Invalid draws: a valid call with one argument corrupted (a tensor of the wrong rank, dtype, size or
device, or not a tensor at all; an option out of range or of the wrong type; a pair that is not a
pair; bad cu_seqlens values; merge parts that do not match) must raise ValueError or TypeError (the
package's exceptions for invalid arguments; NotImplementedError where it documents a refusal of a
valid input, float64 on CUDA) with a message that starts with "fmha: " and names the argument, and
leave every input tensor as it was.

Valid draws: small calls over every option, dtype and layout (transposed, stride-0 broadcast,
non-contiguous last dimension, broadcast-shaped bias) against the float64 reference of
attention_reference.py, forward and every gradient, within SPEC §13 (harness.compare).

  FMHA_FUZZ_PY_INVALID=<n>  invalid draws per device (default 10000)
  FMHA_FUZZ_PY_VALID=<n>    valid draws per device (default 1000)
  FMHA_FUZZ_SEED=<s>        draw i uses seed s + i (default 1); a failure prints the command that
                            replays the draw alone.
"""

from __future__ import annotations

import math
import os
import random
import re
from typing import Callable, Optional

import numpy as np
import pytest
import torch

import attention_reference as reference
import fmha
from cuda_refusals import bucket_not_built
from harness import DEVICES, assert_close, call, rel_error, tolerance

_INVALID = int(os.environ.get("FMHA_FUZZ_PY_INVALID", "10000"))
_VALID = int(os.environ.get("FMHA_FUZZ_PY_VALID", "1000"))
_SEED = int(os.environ.get("FMHA_FUZZ_SEED", "1"))

_NA = {1: fmha.na1d, 2: fmha.na2d, 3: fmha.na3d}
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _replay(kind: str, seed: int, device: str) -> str:
    variable = "FMHA_FUZZ_PY_INVALID" if kind == "invalid" else "FMHA_FUZZ_PY_VALID"
    return (f"{variable}=1 FMHA_FUZZ_SEED={seed} python3 -m pytest -q tests/python/test_fuzz.py "
            f"-p no:cacheprovider -k 'test_{kind}_draws and {device}'")  # fmt: skip


def _short(value) -> str:
    if isinstance(value, torch.Tensor):
        where = "" if value.device.type == "cpu" else f"@{value.device}"
        return f"tensor{list(value.shape)}:{str(value.dtype)[6:]}/{list(value.stride())}{where}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_short(x) for x in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _names(message: str, name: str) -> bool:
    """message names `name` as a word ("options.bias" names bias; "Lq" does not name q)."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


def _randn(rng: random.Random, *shape, dtype=torch.float64, device="cpu") -> torch.Tensor:
    generator = torch.Generator().manual_seed(rng.randrange(1 << 31))
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(device, dtype)


def _offsets(lengths, device) -> torch.Tensor:
    values = [0]
    for n in lengths:
        values.append(values[-1] + n)
    return torch.tensor(values, dtype=torch.int32, device=device)


# ---- Invalid draws ---------------------------------------------------------------------------


class Call:
    """One call of an fmha function: positional arguments and keywords by name."""

    def __init__(self, kind: str, fn: Callable, positional: dict, keywords: dict, sizes: dict):
        self.kind, self.fn, self.positional, self.keywords, self.sizes = kind, fn, positional, keywords, sizes

    def invoke(self):
        return self.fn(*self.positional.values(), **self.keywords)

    def describe(self) -> str:
        arguments = [_short(v) for v in self.positional.values()]
        arguments += [f"{n}={_short(v)}" for n, v in self.keywords.items()]
        return f"{self.fn.__name__}({', '.join(arguments)})"

    def get(self, name):
        return self.positional[name] if name in self.positional else self.keywords.get(name)

    def set(self, name, value) -> None:
        if name in self.positional:
            self.positional[name] = value
        else:
            self.keywords[name] = value

    def tensors(self) -> list:
        found = []

        def walk(x):
            if isinstance(x, torch.Tensor):
                found.append(x)
            elif isinstance(x, (tuple, list)):
                for y in x:
                    walk(y)

        for value in [*self.positional.values(), *self.keywords.values()]:
            walk(value)
        return found


class Slot:
    """A tensor argument of a call: where it sits, what it is, and the names its message may use.
    role: anchor (q, merge's first part), data (the anchor's dtype), bias (broadcastable, with
    the `full` shape it broadcasts to), stat (float32), index (cu_seqlens)."""

    def __init__(self, call: Call, label: str, names: tuple, role: str, required: bool,
                 defines: bool = False, full: Optional[tuple] = None):  # fmt: skip
        self.call, self.label, self.names, self.role = call, label, names, role
        self.required, self.defines, self.full = required, defines, full

    def _where(self):
        match = re.fullmatch(r"(\w+)\[(\d)\]", self.label)
        return (match.group(1), int(match.group(2))) if match else (self.label, None)

    def get(self):
        name, index = self._where()
        value = self.call.get(name)
        return value if index is None else value[index]

    def set(self, value) -> None:
        name, index = self._where()
        if index is None:
            self.call.set(name, value)
            return
        container = list(self.call.get(name))
        container[index] = value
        self.call.set(name, tuple(container) if isinstance(self.call.get(name), tuple) else container)


def _draw_dtype(rng, device):
    cpu_only = [torch.float64] if device == "cpu" else []  # the CUDA backend refuses float64
    return rng.choice([torch.float32, torch.float16, torch.bfloat16] + cpu_only)


def _stat_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _options(rng, call: Call, device, dtype, b, h, hkv, d, dv, rows_q, rows_k, grid_keys: bool):
    """Random valid attention options into call.keywords; their tensor slots."""
    slots = []
    kw = call.keywords
    if rng.random() < 0.3:
        kw["scale"] = rng.uniform(-1.5, 1.5)
    if call.kind != "na":
        if rng.random() < 0.3:
            kw["softcap"] = rng.uniform(0.5, 20)
        if rng.random() < 0.3:
            kw["causal"] = rng.random() < 0.5
        if rng.random() < 0.3:
            kw["causal_alignment"] = rng.choice(["top_left", "bottom_right"])
        if rng.random() < 0.3:
            kw["window"] = (rng.randint(-1, 5), rng.randint(-1, 5))
        if rng.random() < 0.3:
            full = (b, h, rows_q, rows_k)
            spec = rng.choice([full, full[1:], (1, h, 1, rows_k), full[2:], (rows_k,)])
            if call.kind == "varlen":  # the reference expands bias to [B, ...]: at least 3-D
                spec = rng.choice([full, full[1:], (1, h, 1, rows_k)])
            kw["bias"] = _randn(rng, *spec, dtype=dtype, device=device)
            slots.append(Slot(call, "bias", ("bias",), "bias", False, full=full))
        if grid_keys and rows_k > 1 and rng.random() < 0.3:
            hk = next(x for x in (2, 3, 1) if rows_k % x == 0)
            full_h, full_w = (b, h, rows_q, hk), (b, h, rows_q, rows_k // hk)
            kw["rel_pos"] = (_randn(rng, *full_h, dtype=dtype, device=device),
                             _randn(rng, *full_w[1:], dtype=dtype, device=device))  # fmt: skip
            slots.append(Slot(call, "rel_pos[0]", ("rel_pos", "rel_h"), "bias", False, full=full_h))
            slots.append(Slot(call, "rel_pos[1]", ("rel_pos", "rel_w"), "bias", False, full=full_w))
        if rng.random() < 0.2:
            kw["deterministic"] = True
        if rng.random() < 0.2:
            kw["allow_tf32"] = True
    if rng.random() < 0.3:
        kw["sinks"] = _randn(rng, h, dtype=_stat_dtype(dtype), device=device)
        slots.append(Slot(call, "sinks", ("sinks",), "stat", False))
    if rng.random() < 0.3:
        r = rng.randint(1, 2)
        kw["extra_kv"] = (_randn(rng, b, r, hkv, d, dtype=dtype, device=device),
                          _randn(rng, b, r, hkv, dv, dtype=dtype, device=device))  # fmt: skip
        slots.append(Slot(call, "extra_kv[0]", ("extra_kv", "extra_k"), "data", False, defines=True))
        slots.append(Slot(call, "extra_kv[1]", ("extra_kv", "extra_v"), "data", False))
    if rng.random() < 0.3:
        kw["return_lse"] = True
    if rng.random() < 0.2:
        kw["backward_impl"] = rng.choice(["auto", "fused", "split"])
    return slots


def _valid_call(rng: random.Random, device: str):
    """A valid call of a random entry point, and its tensor slots."""
    kind = rng.choice(["dense", "varlen", "na", "merge"])
    dtype = _draw_dtype(rng, device)
    hkv = rng.randint(1, 2)
    h, d = hkv * rng.randint(1, 2), rng.choice([4, 8, 13])
    dv = d if rng.random() < 0.5 else rng.choice([3, 8])
    t = lambda *shape: _randn(rng, *shape, dtype=dtype, device=device)  # noqa: E731
    if kind == "dense":
        b, lq, lk = rng.randint(1, 2), rng.randint(1, 6), rng.randint(1, 6)
        call = Call(kind, fmha.attention, {"q": t(b, lq, h, d), "k": t(b, lk, hkv, d), "v": t(b, lk, hkv, dv)},
                    {}, dict(b=b, h=h))  # fmt: skip
        rows_q, rows_k = lq, lk
    elif kind == "varlen":
        lens_q = [rng.randint(0, 5) for _ in range(rng.randint(1, 3))]
        lens_k = [rng.randint(0, 5) for _ in lens_q]
        b, rows_q, rows_k = len(lens_q), max(lens_q), max(lens_k)
        positional = {"q": t(sum(lens_q), h, d), "k": t(sum(lens_k), hkv, d), "v": t(sum(lens_k), hkv, dv),
                      "cu_seqlens_q": _offsets(lens_q, device), "cu_seqlens_k": _offsets(lens_k, device),
                      "max_seqlen_q": rows_q + rng.choice([0, 0, 2]), "max_seqlen_k": rows_k}  # fmt: skip
        rows_q = positional["max_seqlen_q"]
        call = Call(kind, fmha.attention_varlen, positional, {}, dict(b=b, h=h, lens_q=lens_q, lens_k=lens_k))
    elif kind == "na":
        n = rng.randint(1, 3)
        grid = [rng.randint(1, {1: 7, 2: 4, 3: 3}[n]) for _ in range(n)]
        kernel = [rng.randint(1, x) for x in grid]
        dilation = [rng.randint(1, x // k) for x, k in zip(grid, kernel)]
        causal = [rng.random() < 0.3 for _ in grid]
        b = rng.randint(1, 2)
        def per_axis(values):  # one value for every axis, or a tuple of one per axis
            return values[0] if len(set(values)) == 1 and rng.random() < 0.5 else tuple(values)

        positional = {"q": t(b, *grid, h, d), "k": t(b, *grid, hkv, d), "v": t(b, *grid, hkv, dv),
                      "kernel_size": per_axis(kernel), "dilation": per_axis(dilation),
                      "is_causal": per_axis(causal)}  # fmt: skip
        rows_q = rows_k = math.prod(grid)
        call = Call(kind, _NA[n], positional, {}, dict(b=b, h=h, n=n, grid=grid))
    else:
        b, lq, parts = rng.randint(1, 2), rng.randint(1, 5), rng.randint(1, 3)
        outs = [t(b, lq, h, dv) for _ in range(parts)]
        lses = [_randn(rng, b, h, lq, dtype=_stat_dtype(dtype), device=device) for _ in range(parts)]
        call = Call(kind, fmha.merge_attentions, {"outs": outs, "lses": lses}, {}, dict(parts=parts))
        slots = [Slot(call, f"outs[{i}]", (f"outs[{i}]",), "anchor" if i == 0 else "data", True, defines=i == 0)
                 for i in range(parts)]  # fmt: skip
        slots += [Slot(call, f"lses[{i}]", (f"lses[{i}]",), "stat", True, defines=i == 0) for i in range(parts)]
        return call, slots, dtype
    slots = [Slot(call, "q", ("q",), "anchor", True, defines=True),
             Slot(call, "k", ("k",), "data", True, defines=True),
             Slot(call, "v", ("v",), "data", True, defines=True)]  # fmt: skip
    if kind == "varlen":
        slots.append(Slot(call, "cu_seqlens_q", ("cu_seqlens_q",), "index", True, defines=True))
        slots.append(Slot(call, "cu_seqlens_k", ("cu_seqlens_k",), "index", True))
    slots += _options(rng, call, device, dtype, b, h, hkv, d, dv, rows_q, rows_k, grid_keys=kind != "varlen")
    return call, slots, dtype


class Expected:
    def __init__(self, what: str, names, exceptions=(ValueError, TypeError), any_name: bool = False):
        self.what, self.names, self.exceptions, self.any_name = what, tuple(names), exceptions, any_name


def _refused_dtype(rng, slot: Slot, dtype):
    """A dtype the slot's argument does not accept."""
    choices = [torch.int64, torch.bool, torch.complex64, torch.uint8]
    if slot.role == "index":
        choices += [torch.float32, torch.int16]
    elif slot.role == "stat":
        choices += [torch.float16, torch.bfloat16] + ([] if dtype == torch.float64 else [torch.float64])
    else:
        choices += [x for x in (torch.float32, torch.float16, torch.bfloat16, torch.float64) if x != dtype]
    return rng.choice(choices)


def _checked_dims(call: Call, slot: Slot, x: torch.Tensor) -> list:
    """The dimensions of `x` whose size another argument must match. The Python layer allocates
    out and lse from q and v, so q's query count and heads are checked only where bias, rel-pos
    or sinks have them, and v's value width only against extra_v (the first merge part's against
    the other parts). A varlen q's row count must match the last query offset, which the library
    reads on the CPU only (CUDA offsets stay on the device)."""
    def held_by_bias(position):  # a size > 1 at this position from the right of [B, H, Lq, Lk]
        tensors = [call.keywords.get("bias"), *(call.keywords.get("rel_pos") or ())]
        return any(isinstance(t, torch.Tensor) and t.dim() >= position and t.shape[-position] > 1
                   for t in tensors)  # fmt: skip

    dims = list(range(x.dim()))
    if slot.label == "q":
        heads = x.dim() - 2
        if call.keywords.get("sinks") is None and not held_by_bias(3):
            dims.remove(heads)
        if call.kind == "dense" and not held_by_bias(2):
            dims.remove(1)
        if call.kind == "varlen" and x.device.type != "cpu":
            dims.remove(0)
    if slot.label == "v" and call.keywords.get("extra_kv") is None:
        dims = dims[:-1]
    if slot.label == "outs[0]" and call.sizes.get("parts") == 1:
        dims = dims[:-1]
    return dims


def _corrupt_tensor(rng, call: Call, slots, device, dtype) -> Optional[Expected]:
    slot = rng.choice(slots)
    x = slot.get()
    names = slot.names
    how = rng.choice(["not_a_tensor", "rank", "too_many_dims", "dtype", "size", "device"])
    if how == "not_a_tensor":
        replacement = rng.choice(["list", "float", "numpy", "none"])
        if replacement == "none" and not (slot.required or slot.label[-1] == "]"):
            replacement = "list"  # an optional tensor left out is valid
        makers = {"list": lambda: x.tolist(), "float": lambda: 1.5,
                  "numpy": lambda: np.zeros(tuple(x.shape), dtype=np.float32), "none": lambda: None}  # fmt: skip
        value = makers[replacement]()
        slot.set(value)
        if replacement == "none" and slot.label[-1] == "]" and slot.label.split("[")[0] in ("rel_pos", "extra_kv"):
            names = names + (("rel_h", "rel_w") if slot.label.startswith("rel") else ("extra_k", "extra_v"))
        return Expected(f"{slot.label} given as {replacement}", names)
    if how == "rank":
        if slot.role == "bias" or x.dim() == 1 or x.shape[0] == 0 or rng.random() < 0.5:
            # bias broadcasts from fewer dimensions: only more than 4 is refused
            grown = x.reshape((1,) * max(1, 5 - x.dim()) + tuple(x.shape)) if slot.role == "bias" else x[None]
            slot.set(grown)
            return Expected(f"{slot.label} with rank {grown.dim()}", names)
        slot.set(x[0])
        return Expected(f"{slot.label} with rank {x.dim() - 1}", names)
    if how == "too_many_dims":
        slot.set(x.reshape((1,) * (7 - x.dim()) + tuple(x.shape)))
        return Expected(f"{slot.label} with 7 dimensions", names)
    if how == "dtype":
        new = _refused_dtype(rng, slot, dtype)
        if slot.role == "anchor" and call.kind == "merge" and new.is_floating_point:
            new = torch.int64  # the merged out takes the first part's float dtype: any other is valid
        slot.set(x.to(new) if new != torch.bool else x != 0)
        exceptions = (TypeError,)
        if slot.role == "anchor" and new == torch.float64 and device != "cpu":
            exceptions = (TypeError, NotImplementedError)
        return Expected(f"{slot.label} as {new}", names, exceptions)
    if how == "size":
        dims = _checked_dims(call, slot, x)
        if not dims:
            return None
        dim = rng.choice(dims)
        shape = list(x.shape)
        old = shape[dim]
        if slot.role == "bias":  # 1 and the full size broadcast: neither is a corruption
            full = slot.full[len(slot.full) - x.dim() + dim]
            shape[dim] = max(old, full, 1) + 1
        else:
            shape[dim] = old + 1 if old <= 1 or rng.random() < 0.5 else old - 1
        if slot.role == "index":
            values = x.tolist()
            values = values + [values[-1]] if shape[dim] > old else values[:-1]
            slot.set(torch.tensor(values, dtype=x.dtype, device=x.device))
        else:
            slot.set(_randn(rng, *shape, dtype=x.dtype, device=x.device))
        return Expected(f"{slot.label} with size {shape[dim]} instead of {old} on dimension {dim}", names,
                        any_name=slot.defines)  # fmt: skip
    # device: another real device, or (CPU-only machines) the meta device, which has no backend
    if slot.role == "anchor":
        return None
    other = ("cpu" if device != "cpu" else "cuda") if torch.cuda.is_available() else "meta"
    slot.set(x.to(other))
    return Expected(f"{slot.label} on {other}", names)


def _corrupt_scalar(rng, call: Call, device) -> Optional[Expected]:
    kind, kw = call.kind, call.keywords
    nan, inf = float("nan"), float("inf")
    choices = ["scale", "return_lse", "backward_impl"]
    if kind in ("dense", "varlen"):
        choices += ["softcap", "window", "causal", "causal_alignment", "deterministic", "allow_tf32", "rel_pos",
                    "extra_kv"]  # fmt: skip
    if kind == "varlen":
        choices += ["max_seqlen", "max_seqlen", "varlen_rel_pos"]
        if device == "cpu":  # the library reads cu_seqlens values on the CPU only
            choices += ["offsets", "offsets"]
    if kind == "na":
        choices += ["kernel_size", "kernel_size", "dilation", "dilation", "is_causal", "extra_kv"]
    if kind == "merge":
        choices = ["parts", "parts", "parts"]
    what = rng.choice(choices)
    if what == "scale":
        kw["scale"] = rng.choice([nan, inf, -inf, "0.5", 1j, [1.0], torch.ones(2)])
        return Expected(f"scale={_short(kw['scale'])}", ["scale"])
    if what == "softcap":
        kw["softcap"] = rng.choice([-1.0, nan, inf, "2", None, 1j])
        return Expected(f"softcap={_short(kw['softcap'])}", ["softcap"])
    if what == "window":
        kw["window"] = rng.choice([3, (1,), (1, 2, 3), (-2, 0), (0, -5), (1.5, 2), (None, 0), ("a", 1),
                                   (2**63, 0), (0, -(2**70)), "left"])  # fmt: skip
        return Expected(f"window={kw['window']!r}", ["window", "window_left", "window_right"])
    if what in ("causal", "deterministic", "allow_tf32", "return_lse"):
        kw[what] = rng.choice(["yes", "False", torch.ones(2, dtype=torch.bool)])
        return Expected(f"{what}={_short(kw[what])}", [what])
    if what == "causal_alignment":
        kw["causal_alignment"] = rng.choice(["bottom", "TOP_LEFT", None, 1, ""])
        return Expected(f"causal_alignment={kw['causal_alignment']!r}", ["causal_alignment"])
    if what == "backward_impl":
        kw["backward_impl"] = rng.choice(["fast", None, 2, "Fused"])
        return Expected(f"backward_impl={kw['backward_impl']!r}", ["backward_impl"])
    if what in ("rel_pos", "extra_kv"):
        some = call.get("q")
        kw[what] = rng.choice([some, (some,), (some, some, some), "pair"])
        return Expected(f"{what}={_short(kw[what])}", [what])
    if what == "varlen_rel_pos":
        b, h, mq = call.sizes["b"], call.sizes["h"], call.get("max_seqlen_q")
        mk = call.get("max_seqlen_k")
        kw["rel_pos"] = (torch.randn(b, h, mq, 1, device=device, dtype=call.get("q").dtype),
                         torch.randn(b, h, mq, mk, device=device, dtype=call.get("q").dtype))  # fmt: skip
        return Expected("rel_pos given to attention_varlen", ["rel_pos", "rel_h", "rel_w"])
    if what == "max_seqlen":
        name = rng.choice(["max_seqlen_q", "max_seqlen_k"])
        longest = max(call.sizes["lens_q" if name.endswith("q") else "lens_k"])
        values = [-1, -7, 2.5, None, "4", 2**64]
        if device == "cpu" and longest > 0:
            values.append(longest - 1)
        call.positional[name] = rng.choice(values)
        return Expected(f"{name}={call.positional[name]!r}", [name, name.replace("max_seqlen", "cu_seqlens")])
    if what == "offsets":
        name = rng.choice(["cu_seqlens_q", "cu_seqlens_k"])
        values = call.positional[name].tolist()
        i = rng.randrange(len(values))
        if i == 0:
            values[0] = rng.choice([1, -1])
        elif i == len(values) - 1:
            values[i] += rng.choice([1, -1]) if values[i] > values[i - 1] else 1
        else:
            values[i] = values[i - 1] - 1
        call.positional[name] = torch.tensor(values, dtype=torch.int32, device=device)
        return Expected(f"{name}={values}", [name])
    if what in ("kernel_size", "dilation", "is_causal"):
        n, grid = call.sizes["n"], call.sizes["grid"]
        if what == "is_causal":
            value = rng.choice([(True,) * (n + 1), "yes", (False,) * (n - 1) if n > 1 else (), torch.ones(2)])
        else:
            value = rng.choice([0, -1, 2.5, "3", None, 2**63, (1,) * (n + 1), max(grid) + 1,
                                [grid[0] + 1] + [1] * (n - 1)])  # fmt: skip
        call.positional[what] = value
        names = [what] + [f"{what}[{r}]" for r in range(3)]
        if what != "is_causal":
            names += ["kernel_size", "dilation"]  # kernel * dilation wider than the grid names both
        return Expected(f"{what}={_short(value)}", names)
    # merge parts
    outs, lses = call.positional["outs"], call.positional["lses"]
    pick = rng.randrange(4)
    if pick == 0:
        call.positional["outs"], call.positional["lses"] = [], []
        return Expected("no parts", ["outs"])
    if pick == 1:
        call.positional["lses"] = lses[:-1] if len(lses) > 1 else lses + lses
        return Expected(f"{len(outs)} outs, {len(call.positional['lses'])} lses", ["outs", "lses"])
    container = rng.choice(["outs", "lses"])
    call.positional[container] = call.positional[container][0] if pick == 2 else "parts"
    return Expected(f"{container} not a list", [container])


def _invalid_draw(seed: int, device: str):
    rng = random.Random(seed)
    call, slots, dtype = _valid_call(rng, device)
    base = call.describe()
    expected = None
    while expected is None:
        if rng.random() < 0.5:
            expected = _corrupt_tensor(rng, call, slots, device, dtype)
        else:
            expected = _corrupt_scalar(rng, call, device)
    return call, expected, base


def _check_invalid(seed: int, device: str) -> Optional[str]:
    """None when the draw is refused as it must be, else what went wrong."""
    call, expected, base = _invalid_draw(seed, device)
    inputs = [(t, t.clone()) for t in call.tensors() if t.device.type != "meta"]
    try:
        call.invoke()
    except expected.exceptions as error:
        message = str(error)
        problems = []
        if not message.startswith("fmha: "):
            problems.append('the message does not start with "fmha: "')
        names = expected.names
        if expected.any_name:  # a size this argument sets for others: the message names one of them
            names += ("q", "k", "v", "bias", "sinks", "extra_k", "extra_v", "rel_h", "rel_w", "cu_seqlens_q",
                      "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "outs", "lses")  # fmt: skip
        if not any(_names(message, n) for n in names):
            problems.append(f"the message names none of {list(expected.names)}")
        for before_tensor, before in inputs:
            if not torch.equal(before_tensor, before):
                problems.append("an input tensor was changed")
                break
        if not problems:
            return None
        detail = f"{type(error).__name__}: {message}\n  " + "\n  ".join(problems)
    except Exception as error:  # noqa: BLE001  (any other exception is the finding)
        # A CUDA build without the draw's head-dim bucket may refuse the call for that before any
        # check names the corruption (seen on a bucket-64 build: varlen draws whose q lost a row).
        # Such a draw tells nothing of this build's checks; it counts as skipped, as every test
        # that meets the refusal skips (conftest.py).
        if bucket_not_built(error):
            return None
        detail = f"raised {type(error).__name__} instead of {[e.__name__ for e in expected.exceptions]}: {error}"
    else:
        detail = "accepted"
    return (f"invalid draw seed {seed}: {expected.what}: {detail}\n  draw: {base}\n"
            f"  replay: {_replay('invalid', seed, device)}")  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_invalid_draws(device):
    failures = []
    for i in range(_INVALID):
        failure = _check_invalid(_SEED + i, device)
        if failure:
            failures.append(failure)
            if len(failures) == 3:
                break
    assert not failures, "\n".join(failures)


# ---- Valid draws -----------------------------------------------------------------------------


def _layout(rng, shape):
    """(master shape, view making the argument from the master): contiguous, heads outside the
    tokens (a transposed view), stride 2 on the last dimension (copied by fmha), or stride 0 on
    the batch dimension (an expand())."""
    how = rng.choice(["contiguous", "contiguous", "transposed", "last_stride_2", "broadcast"])
    if how == "transposed" and len(shape) >= 4:
        master = (shape[0], shape[-2], *shape[1:-2], shape[-1])
        return master, lambda x: x.movedim(1, -2), how
    if how == "last_stride_2":
        return shape, lambda x: torch.stack([x, x], dim=-1)[..., 0], how
    if how == "broadcast" and len(shape) >= 4:
        return (1, *shape[1:]), lambda x: x.expand(*shape), how
    return shape, lambda x: x, "contiguous"


class ValidDraw:
    """Float64 masters of the inputs, how each argument is made from its master, and the calls of
    fmha and of the reference on the prepared tensors."""

    def __init__(self, seed: int, device: str):
        rng = random.Random(seed)
        self.device = device
        cpu_only = [torch.float64] * 2 if device == "cpu" else []  # the CUDA backend refuses float64
        self.dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16] + cpu_only)
        self.kind = rng.choice(["dense", "dense", "varlen", "na", "merge"])
        self.inputs, self.views, self.stat_inputs, self.options, self.layouts = {}, {}, ("sinks",), {}, {}
        getattr(self, f"_draw_{self.kind}")(rng)

    def describe(self) -> str:
        shapes = ", ".join(f"{n}{list(t.shape)}{'/' + self.layouts[n] if n in self.layouts else ''}"
                           for n, t in self.inputs.items())  # fmt: skip
        extra = f" lens_q={self.lens_q} lens_k={self.lens_k}" if self.kind == "varlen" else ""
        return f"{self.kind} {str(self.dtype)[6:]} {shapes}{extra} {self.options}"

    def _input(self, rng, name, shape):
        master, view, how = _layout(rng, shape)
        self.inputs[name] = _randn(rng, *master)
        self.views[name] = view
        if how != "contiguous":
            self.layouts[name] = how

    def _args(self, tensors):
        return {n: self.views.get(n, lambda x: x)(t) for n, t in tensors.items()}

    def _draw_options(self, rng, b, h, hkv, d, dv, rows_q, rows_k, grid_keys):
        o = self.options
        if rng.random() < 0.3:
            o["scale"] = rng.uniform(-1.2, 1.2)
        if self.kind != "na":
            if rng.random() < 0.3:
                o["softcap"] = rng.uniform(0.5, 8)
            o["causal"] = rng.random() < 0.35
            o["causal_alignment"] = rng.choice(["top_left", "bottom_right"])
            if rng.random() < 0.3:
                o["window"] = (rng.randint(-1, 6), rng.randint(-1, 6))
            if rng.random() < 0.35:
                full = (b, h, rows_q, rows_k)
                spec = rng.choice([full, full[1:], (1, h, 1, rows_k), full[2:], (b, 1, rows_q, 1)])
                if self.kind == "varlen":  # the reference expands bias to [B, ...]: at least 3-D
                    spec = rng.choice([full, full[1:], (1, h, 1, rows_k), (b, 1, rows_q, 1)])
                self.inputs["bias"] = _randn(rng, *spec)
                if rng.random() < 0.3 and len(spec) == 4:  # passed as a stride-0 expand() of itself
                    self.views["bias"] = lambda x: x.expand(*full)
                    self.layouts["bias"] = "expanded"
            if grid_keys and rows_k > 1 and rng.random() < 0.3:
                hk = next(x for x in (2, 3, 1) if rows_k % x == 0)
                self.inputs["rel_h"] = _randn(rng, b, h, rows_q, hk)
                self.inputs["rel_w"] = _randn(rng, h, rows_q, rows_k // hk)
            o["deterministic"] = rng.random() < 0.2
        if rng.random() < 0.3:
            self.inputs["sinks"] = _randn(rng, h)
        if rng.random() < 0.3:
            r = rng.randint(1, 3)
            self.inputs["extra_k"] = _randn(rng, b, r, hkv, d)
            self.inputs["extra_v"] = _randn(rng, b, r, hkv, dv)
        if rng.random() < 0.2:
            o["backward_impl"] = rng.choice(["auto", "fused", "split"])

    def _sizes(self, rng):
        hkv = rng.randint(1, 2)
        d = rng.choice([1, 4, 8, 16, 24, rng.randint(1, 40)])
        return hkv * rng.randint(1, 3), hkv, d, d if rng.random() < 0.5 else rng.choice([1, 8, rng.randint(1, 40)])

    def _draw_dense(self, rng):
        h, hkv, d, dv = self._sizes(rng)
        b, lq, lk = rng.randint(1, 2), rng.choice([0, rng.randint(1, 16)]), rng.choice([0, rng.randint(1, 16)])
        if rng.random() < 0.8:
            lq, lk = max(lq, 1), max(lk, 1)
        self._input(rng, "q", (b, lq, h, d))
        self._input(rng, "k", (b, lk, hkv, d))
        self._input(rng, "v", (b, lk, hkv, dv))
        self._draw_options(rng, b, h, hkv, d, dv, lq, lk, grid_keys=True)

    def _draw_varlen(self, rng):
        h, hkv, d, dv = self._sizes(rng)
        self.lens_q = [rng.choice([0, rng.randint(1, 10)]) for _ in range(rng.randint(1, 3))]
        self.lens_k = [rng.choice([0, rng.randint(1, 10)]) for _ in self.lens_q]
        b = len(self.lens_q)
        self._input(rng, "q", (sum(self.lens_q), h, d))
        self._input(rng, "k", (sum(self.lens_k), hkv, d))
        self._input(rng, "v", (sum(self.lens_k), hkv, dv))
        self._draw_options(rng, b, h, hkv, d, dv, max(self.lens_q), max(self.lens_k), grid_keys=False)

    def _draw_na(self, rng):
        h, hkv, d, dv = self._sizes(rng)
        n = rng.randint(1, 3)
        self.grid = [rng.randint(1, {1: 12, 2: 5, 3: 3}[n]) for _ in range(n)]
        self.kernel = [rng.randint(1, x) for x in self.grid]
        self.dilation = [rng.randint(1, x // k) for x, k in zip(self.grid, self.kernel)]
        self.is_causal = [rng.random() < 0.3 for _ in self.grid]
        b = rng.randint(1, 2)
        self._input(rng, "q", (b, *self.grid, h, d))
        self._input(rng, "k", (b, *self.grid, hkv, d))
        self._input(rng, "v", (b, *self.grid, hkv, dv))
        self._draw_options(rng, b, h, hkv, d, dv, 0, 0, grid_keys=False)
        self.options.update(kernel_size=self.kernel, dilation=self.dilation, is_causal=self.is_causal)

    def _draw_merge(self, rng):
        b, lq, h, dv = rng.randint(1, 2), rng.randint(0, 6), rng.randint(1, 4), rng.randint(1, 24)
        self.parts = rng.randint(1, 4)
        for p in range(self.parts):
            self._input(rng, f"out{p}", (b, lq, h, dv))
            lse = _randn(rng, b, h, lq) * 2
            generator = torch.Generator().manual_seed(rng.randrange(1 << 31))
            lse[torch.rand(lse.shape, generator=generator) < 0.15] = -math.inf  # parts that saw no key
            self.inputs[f"lse{p}"] = lse
        self.stat_inputs = tuple(f"lse{p}" for p in range(self.parts))

    # -- the calls -----------------------------------------------------------------------------

    def run_fmha(self, **tensors):
        a, o = self._args(tensors), self.options
        if self.kind == "merge":
            return fmha.merge_attentions([a[f"out{p}"] for p in range(self.parts)],
                                         [a[f"lse{p}"] for p in range(self.parts)])  # fmt: skip
        rel = (a["rel_h"], a["rel_w"]) if "rel_h" in a else None
        extra = (a["extra_k"], a["extra_v"]) if "extra_k" in a else None
        if self.kind == "na":
            kernel = o["kernel_size"] if len(set(o["kernel_size"])) > 1 else o["kernel_size"][0]
            return _NA[len(self.grid)](a["q"], a["k"], a["v"], kernel, tuple(o["dilation"]), tuple(o["is_causal"]),
                                       scale=o.get("scale"), extra_kv=extra, sinks=a.get("sinks"), return_lse=True,
                                       backward_impl=o.get("backward_impl", "auto"))  # fmt: skip
        kwargs = {n: v for n, v in o.items()}
        kwargs.update(bias=a.get("bias"), rel_pos=rel, sinks=a.get("sinks"), extra_kv=extra, return_lse=True)
        if self.kind == "varlen":
            cu_q, cu_k = _offsets(self.lens_q, a["q"].device), _offsets(self.lens_k, a["q"].device)
            return fmha.attention_varlen(a["q"], a["k"], a["v"], cu_q, cu_k, max(self.lens_q), max(self.lens_k),
                                         **kwargs)  # fmt: skip
        return fmha.attention(a["q"], a["k"], a["v"], **kwargs)

    def run_reference(self, **tensors):
        a, o = self._args(tensors), self.options
        if self.kind == "merge":
            parts = range(self.parts)
            return reference.merge([a[f"out{p}"] for p in parts], [a[f"lse{p}"] for p in parts])
        scale = o.get("scale")
        common = dict(scale=None if scale is None else reference.as_f32(scale), sinks=a.get("sinks"),
                      extra_kv=(a["extra_k"], a["extra_v"]) if "extra_k" in a else None)  # fmt: skip
        if self.kind == "na":
            mask = reference.neighborhood_mask(self.grid, o["kernel_size"], o["dilation"], o["is_causal"])
            b, h = a["q"].shape[0], a["q"].shape[-2]
            flat = lambda x: x.reshape(b, -1, *x.shape[-2:])  # noqa: E731
            out, lse = reference.attention(flat(a["q"]), flat(a["k"]), flat(a["v"]), mask=mask, **common)
            return out.reshape(*a["q"].shape[:-1], a["v"].shape[-1]), lse.reshape(b, h, *self.grid)
        common["softcap"] = reference.as_f32(o.get("softcap", 0.0))

        def mask_of(lq, lk):
            return reference.sequence_mask(lq, lk, causal=o["causal"], alignment=o["causal_alignment"],
                                           window=o.get("window"))  # fmt: skip

        if self.kind == "varlen":
            cu_q, cu_k = _offsets(self.lens_q, "cpu").tolist(), _offsets(self.lens_k, "cpu").tolist()
            return reference.attention_varlen(a["q"], a["k"], a["v"], cu_q, cu_k, bias=a.get("bias"), mask_fn=mask_of,
                                              **common)  # fmt: skip
        rel = (a["rel_h"], a["rel_w"]) if "rel_h" in a else None
        return reference.attention(a["q"], a["k"], a["v"], mask=mask_of(a["q"].shape[1], a["k"].shape[1]),
                                   bias=a.get("bias"), rel_pos=rel, **common)  # fmt: skip


def _finite(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _check_valid(draw: ValidDraw, device: str, seed: int) -> None:
    """Forward and every gradient against the float64 reference on the same inputs (SPEC §13):
    the reference and the naive same-dtype computation get the values fmha gets, rounded to its
    dtypes, and so do the loss's weights, which become the gradients flowing into out and lse.
    fp16 / bf16: 2 x the naive computation's error + 1e-4, plus the error of storing the exact
    result in the output's dtype (a correctly rounded answer passes even where the naive
    computation happens to be exact, as tiny problems allow), and for the gradients the error that
    the stored output brings into them: the backward's row term is dot(dout, out) with out as stored
    (SPEC §11), so it runs the exact backward with dlse shifted by dot(dout, out - exact out), which
    under cancellation (a few keys) outgrows the naive autograd's, whose row term is sum(P dP);
    fp32 1e-5; fp64 1e-10."""
    dtype = draw.dtype
    stats = torch.float64 if dtype == torch.float64 else torch.float32
    rounded = {n: m.to(stats if n in draw.stat_inputs else dtype) for n, m in draw.inputs.items()}

    def leaves(to_dtype, to_device):
        return {n: x.detach().to(to_device, x.dtype if to_dtype is None else to_dtype).requires_grad_(True)
                for n, x in rounded.items()}  # fmt: skip

    ours = leaves(None, device)
    out, lse = call(device, draw.run_fmha, **ours)
    generator = torch.Generator().manual_seed(seed)
    g_out = torch.randn(out.shape, generator=generator, dtype=torch.float64).to(out.dtype).double()
    g_lse = torch.randn(lse.shape, generator=generator, dtype=torch.float64).to(lse.dtype).double()

    def gradients(out_, lse_, tensors, g_lse_=g_lse):
        loss = (out_.double().cpu() * g_out).sum() + (_finite(lse_.double().cpu()) * g_lse_).sum()
        return torch.autograd.grad(loss, list(tensors.values()), allow_unused=True, retain_graph=True)

    grads = call(device, gradients, out, lse, ours)
    ref = leaves(torch.float64, "cpu")
    ref_out, ref_lse = draw.run_reference(**ref)
    ref_grads = gradients(ref_out, ref_lse, ref)
    results = {"out": (out, ref_out), "lse": (lse, ref_lse)}
    for name, g, r in zip(rounded, grads, ref_grads):
        assert g is not None, f"d{name}: no gradient reached {name}"
        results[f"d{name}"] = (g, r)
    if dtype in _LOW_PRECISION:
        naive = leaves(None, "cpu")
        naive_out, naive_lse = draw.run_reference(**naive)
        naive_results = {"out": naive_out, "lse": naive_lse}
        naive_results.update({f"d{n}": g for n, g in zip(rounded, gradients(naive_out, naive_lse, naive))})
        stored_out = {}  # per gradient: the reference's, from the shifted dlse
        if draw.kind != "merge":
            shift = (g_out * (out.detach().double().cpu() - ref_out.detach())).sum(-1)
            shift = shift.movedim(-1, 0 if draw.kind == "varlen" else 1)  # out's rows in lse's layout
            shifted = gradients(ref_out, ref_lse, ref, g_lse - shift)
            stored_out = {f"d{n}": rel_error(g, r) for n, g, r in zip(rounded, shifted, ref_grads)}
        for name, (x, r) in results.items():
            stored = rel_error(r.to(x.dtype), r) + stored_out.get(name, 0.0)
            assert_close(name, x, r, 2 * rel_error(naive_results[name], r) + stored + 1e-4)
    else:
        for name, (x, r) in results.items():
            assert_close(name, x, r, tolerance(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_valid_draws(device):
    refused = {}
    for i in range(_VALID):
        seed = _SEED + i
        draw = ValidDraw(seed, device)
        try:
            _check_valid(draw, device, seed)
        except pytest.skip.Exception as skip:  # a valid call the CUDA backend does not run
            refused[str(skip)] = refused.get(str(skip), 0) + 1
        except (Exception, pytest.fail.Exception) as error:
            raise AssertionError(f"valid draw seed {seed}: {draw.describe()}\n  {type(error).__name__}: {error}\n"
                                 f"  replay: {_replay('valid', seed, device)}") from error  # fmt: skip
    for message, count in refused.items():
        print(f"[ fuzz ] refused as not supported {count}x: {message}")
