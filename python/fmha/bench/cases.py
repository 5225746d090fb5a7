"""Benchmark cases and the named suites that group them.

A Case describes one attention problem completely (shapes, dtype, masks, score modifiers), so every
implementation, the reference and the FLOP counter read the same description.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

# Timed directions. Backward FLOPs are 2.5x forward by convention (FlashAttention's accounting:
# two matmuls forward, five backward), so "fwd+bwd" is 3.5x.
DIRECTIONS = ("fwd", "bwd", "fwd+bwd")
BACKWARD_FLOP_FACTOR = 2.5


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    kind: str = "dense"  # "dense", "varlen", "na" or "decode" (Lq 1 over a KV cache of Lk tokens)
    B: int = 1
    H: int = 1
    Hkv: Optional[int] = None  # None: same as H
    Lq: int = 0
    Lk: int = 0
    D: int = 64
    Dv: Optional[int] = None  # None: same as D
    dtype: str = "bf16"
    causal: bool = False
    window: Optional[tuple] = None  # (left, right), -1 unbounded
    bias: bool = False  # [B, H, Lq, Lk] additive bias, no gradient (a fixed mask-like bias)
    bias_shared: bool = False  # the bias is [1, H, Lq, Lk]: one for every batch (a learned bias)
    bias_grad: bool = False  # the bias receives its gradient (dbias; summed over B when shared)
    rel_pos: Optional[tuple] = None  # (Hk, Wk) key grid of SAM-style rel_h / rel_w (with gradients)
    softcap: float = 0.0
    sinks: bool = False  # [H] fp32 sink logits (with gradients)
    seqlens: Optional[tuple] = None  # varlen: per-sequence lengths (q and k alike)
    grid: Optional[tuple] = None  # na: token grid (X1, X2, X3)
    kernel: Optional[tuple] = None  # na: kernel size per axis
    dilation: Optional[tuple] = None  # na: dilation per axis
    na_causal: Optional[tuple] = None  # na: causal flag per axis
    directions: tuple = DIRECTIONS
    # Labels used by the plots: one series point per seq_len, one panel per group.
    group: str = ""
    seq_len: int = 0

    @property
    def hkv(self) -> int:
        return self.Hkv if self.Hkv is not None else self.H

    @property
    def dv(self) -> int:
        return self.Dv if self.Dv is not None else self.D

    @property
    def total_tokens(self) -> int:
        if self.kind == "varlen":
            return sum(self.seqlens)
        return self.B * self.Lq

    def describe(self) -> dict:
        """The case as plain JSON-friendly values, defaults left out."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default or f.name in ("name", "kind", "dtype"):
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def dense(name, *, B, H, L, D, Lk=None, **kw) -> Case:
    return Case(name=name, kind="dense", B=B, H=H, Lq=L, Lk=L if Lk is None else Lk, D=D, **kw)


def na(name, *, B, H, grid, kernel, dilation=None, causal=None, D, **kw) -> Case:
    n = len(grid)
    tokens = math.prod(grid)
    return Case(name=name, kind="na", B=B, H=H, Lq=tokens, Lk=tokens, D=D, grid=tuple(grid),
                kernel=tuple(kernel), dilation=tuple(dilation or (1,) * n),
                na_causal=tuple(causal or (False,) * n), **kw)


def varlen(name, *, seqlens, H, D, **kw) -> Case:
    return Case(name=name, kind="varlen", B=len(seqlens), H=H, Lq=max(seqlens), Lk=max(seqlens),
                D=D, seqlens=tuple(seqlens), **kw)


def decode(name, *, B, H, Hkv, L, D, **kw) -> Case:
    """One query token a sequence over a KV cache of L tokens (forward only: serving)."""
    return Case(name=name, kind="decode", B=B, H=H, Hkv=Hkv, Lq=1, Lk=L, D=D,
                directions=("fwd",), seq_len=L, **kw)


def _varlen_lengths(total: int, count: int, seed: int = 0) -> tuple:
    """Deterministic uneven sequence lengths summing to `total` (a packed batch of documents)."""
    import random

    rng = random.Random(seed)
    weights = [rng.uniform(0.2, 1.0) for _ in range(count)]
    lengths = [max(1, int(total * w / sum(weights))) for w in weights]
    lengths[-1] += total - sum(lengths)
    return tuple(lengths)


# ---- GPU suites -------------------------------------------------------------------------------------


def _standard_gpu() -> list:
    """Dense grid at 16k tokens per batch and hidden size 2048 (H = 2048 / D), bf16."""
    cases = []
    for D in (64, 128, 256):
        for causal in (False, True):
            for L in (512, 1024, 2048, 4096, 8192, 16384):
                cases.append(dense(f"D{D}{' causal' if causal else ''} L{L}", B=16384 // L,
                                   H=2048 // D, L=L, D=D, causal=causal,
                                   group=f"D={D}{', causal' if causal else ''}", seq_len=L))
    return cases


def _features_gpu() -> list:
    return [
        dense("bias B2 H16 L2048 D128", B=2, H=16, L=2048, D=128, bias=True),
        # Issue 4's general-bias case: a [1, H, L, L] bias at the SAM-B shape, fixed and learned.
        dense("bias [1,H,L,L] SAM-B B8 H12 L4096 D64", B=8, H=12, L=4096, D=64, bias=True,
              bias_shared=True),
        dense("dbias [1,H,L,L] SAM-B B8 H12 L4096 D64", B=8, H=12, L=4096, D=64, bias=True,
              bias_shared=True, bias_grad=True),
        dense("rel-pos SAM-B B8 H12 64x64 D64", B=8, H=12, L=4096, D=64, rel_pos=(64, 64)),
        dense("rel-pos SAM-H B8 H16 64x64 D80", B=8, H=16, L=4096, D=80, rel_pos=(64, 64)),
        # The same attention without the bias: the rel-pos cost is the ratio of the two.
        dense("no-bias SAM-B B8 H12 L4096 D64", B=8, H=12, L=4096, D=64),
        dense("no-bias SAM-H B8 H16 L4096 D80", B=8, H=16, L=4096, D=80),
        dense("GQA H32/Hkv8 D128 L8192 causal", B=2, H=32, Hkv=8, L=8192, D=128, causal=True),
        # The same query shape without GQA (issue 4: GQA no slower than H = Hkv).
        dense("MHA H32 D128 L8192 causal", B=2, H=32, L=8192, D=128, causal=True),
        dense("fp32 B4 H16 L2048 D64", B=4, H=16, L=2048, D=64, dtype="fp32"),
        dense("fp32 B4 H16 L2048 D64 causal", B=4, H=16, L=2048, D=64, causal=True, dtype="fp32"),
        dense("softcap 50 B2 H16 L4096 D128 causal", B=2, H=16, L=4096, D=128, causal=True,
              softcap=50.0),
        dense("window (1024,0) B2 H16 L8192 D128", B=2, H=16, L=8192, D=128, window=(1024, 0)),
        dense("sinks B2 H16 L4096 D64 causal", B=2, H=16, L=4096, D=64, causal=True, sinks=True),
        varlen("varlen 12 seqs 16k tokens H16 D128 causal", seqlens=_varlen_lengths(16384, 12),
               H=16, D=128, causal=True),
    ]


def _na_gpu() -> list:
    """The neighborhood-attention cases of issue 5, head dims 64 and 128 (H = 1024 / D)."""
    cases = []
    for D in (64, 128):
        H = 1024 // D
        cases += [
            na(f"NA1d L32768 K2047 D{D}", B=1, H=H, grid=(32768,), kernel=(2047,), D=D),
            na(f"NA1d L32768 K2047 dil4 D{D}", B=1, H=H, grid=(32768,), kernel=(2047,),
               dilation=(4,), D=D),
            # The same 32k tokens as a batch of four (one launch a dilation group).
            na(f"NA1d 4x8192 K1023 dil4 D{D}", B=4, H=H, grid=(8192,), kernel=(1023,),
               dilation=(4,), D=D),
            na(f"NA2d 64x64 K13x13 D{D}", B=8, H=H, grid=(64, 64), kernel=(13, 13), D=D),
            na(f"NA2d 128x128 K7x7 dil2 D{D}", B=2, H=H, grid=(128, 128), kernel=(7, 7),
               dilation=(2, 2), D=D),
            na(f"NA3d 16x32x32 K7x7x7 D{D}", B=2, H=H, grid=(16, 32, 32), kernel=(7, 7, 7), D=D),
        ]
    return cases


def _memory_gpu() -> list:
    return [dense(f"memory D128 L{L}", B=1, H=16, L=L, D=128, causal=True, directions=("fwd+bwd",),
                  group="B=1 H=16 D=128 causal bf16", seq_len=L)
            for L in (1024, 2048, 4096, 8192, 16384, 32768)]


# Decode: issue 33's grid. Heads (H, Hkv): GQA 32/8, MHA 32/32, MQA 32/1.
DECODE_HEADS = (("GQA", 32, 8), ("MHA", 32, 32), ("MQA", 32, 1))


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _decode_gpu() -> list:
    """bf16 decode, B 1 / 8 / 64 x L 4k / 32k / 128k, D 64 / 128 / 256, every head layout; the
    command line drops the cases whose cache does not fit the GPU (__main__.fits_memory)."""
    cases = []
    for label, H, Hkv in DECODE_HEADS:
        for D in (64, 128, 256):
            for B in (1, 8, 64):
                for L in (4096, 32768, 131072):
                    cases.append(decode(f"{label} {H}/{Hkv} D{D} B{B} L{_tokens(L)}", B=B, H=H,
                                        Hkv=Hkv, L=L, D=D))
    return cases


def _quick_gpu() -> list:
    std = {c.name: c for c in _standard_gpu()}
    feats = {c.name: c for c in _features_gpu()}
    return [std["D128 L1024"], std["D128 L4096"], std["D128 causal L4096"],
            feats["GQA H32/Hkv8 D128 L8192 causal"],
            na("NA2d 64x64 K13x13 D128", B=8, H=8, grid=(64, 64), kernel=(13, 13), D=128)]


# ---- CPU suites: shapes for a 2-core machine. Dense and varlen attention in fp32 / fp16 / bf16
# without bias, rel-pos or extra keys run on the fast CPU backend (src/cpu/); the other features on
# the float64 reference, so their cases stay small. ----


def _standard_cpu() -> list:
    # The grid of the CPU backend's targets: fp32 and bf16, D 64 / 128, L 512-2048, causal and not,
    # B 1 H 8 (4096 is left out: a 2-core machine takes minutes per cell with every peer).
    cases = []
    for dtype in ("fp32", "bf16"):
        for D in (64, 128):
            for causal in (False, True):
                for L in (512, 1024, 2048):
                    tag = f"{' causal' if causal else ''}"
                    cases.append(dense(f"{dtype} D{D}{tag} L{L}", B=1, H=8, L=L, D=D,
                                       causal=causal, dtype=dtype,
                                       group=f"{dtype} D={D}{',' + tag if causal else ''}",
                                       seq_len=L))
    return cases


def _features_cpu() -> list:
    return [
        dense("bias B1 H4 L256 D32", B=1, H=4, L=256, D=32, bias=True, dtype="fp32"),
        dense("dbias [1,H,L,L] B2 H2 L128 D32", B=2, H=2, L=128, D=32, bias=True,
              bias_shared=True, bias_grad=True, dtype="fp32"),
        dense("rel-pos B1 H2 16x16 D32", B=1, H=2, L=256, D=32, rel_pos=(16, 16), dtype="fp32"),
        dense("GQA H8/Hkv2 L256 D32 causal", B=1, H=8, Hkv=2, L=256, D=32, causal=True,
              dtype="fp32"),
        dense("bf16 B1 H4 L256 D64", B=1, H=4, L=256, D=64),
        dense("softcap 50 B1 H4 L256 D32", B=1, H=4, L=256, D=32, softcap=50.0, dtype="fp32"),
        dense("window (64,0) B1 H4 L512 D32", B=1, H=4, L=512, D=32, window=(64, 0),
              dtype="fp32"),
        dense("sinks B1 H4 L256 D32 causal", B=1, H=4, L=256, D=32, causal=True, sinks=True,
              dtype="fp32"),
        varlen("varlen 4 seqs 512 tokens H4 D32 causal", seqlens=_varlen_lengths(512, 4), H=4,
               D=32, causal=True, dtype="fp32"),
    ]


def _na_cpu() -> list:
    return [
        na("NA1d L1024 K63 D32", B=1, H=2, grid=(1024,), kernel=(63,), D=32, dtype="fp32"),
        na("NA1d L1024 K63 dil4 D32", B=1, H=2, grid=(1024,), kernel=(63,), dilation=(4,), D=32,
           dtype="fp32"),
        na("NA2d 16x16 K5x5 D32", B=1, H=2, grid=(16, 16), kernel=(5, 5), D=32, dtype="fp32"),
        na("NA3d 8x8x8 K3x3x3 D32", B=1, H=2, grid=(8, 8, 8), kernel=(3, 3, 3), D=32,
           dtype="fp32"),
    ]


def _memory_cpu() -> list:
    return [dense(f"memory D32 L{L}", B=1, H=2, L=L, D=32, causal=True, dtype="fp32",
                  directions=("fwd+bwd",), group="B=1 H=2 D=32 causal fp32", seq_len=L)
            for L in (128, 256, 512)]


def _quick_cpu() -> list:
    return [
        dense("D32 L128", B=2, H=2, L=128, D=32, dtype="fp32", group="D=32", seq_len=128),
        dense("D32 L256", B=1, H=2, L=256, D=32, dtype="fp32", group="D=32", seq_len=256),
        dense("D32 causal L256", B=1, H=2, L=256, D=32, causal=True, dtype="fp32",
              group="D=32, causal", seq_len=256),
        dense("GQA H4/Hkv2 L128 D32 causal", B=1, H=4, Hkv=2, L=128, D=32, causal=True,
              dtype="fp32"),
        na("NA2d 12x12 K5x5 D32", B=1, H=2, grid=(12, 12), kernel=(5, 5), D=32, dtype="fp32"),
    ]


def _decode_cpu() -> list:
    """The decode grid's head layouts at 8 query heads (GQA 8/2, MHA 8/8, MQA 8/1), fp32, short
    caches; L 1000 leaves the last page of every page size partly filled."""
    cases = []
    for label, H, Hkv in (("GQA", 8, 2), ("MHA", 8, 8), ("MQA", 8, 1)):
        for D in (64, 128):
            for B, L in ((1, 4096), (4, 1000)):
                cases.append(decode(f"{label} {H}/{Hkv} D{D} B{B} L{_tokens(L)}", B=B, H=H,
                                    Hkv=Hkv, L=L, D=D, dtype="fp32"))
    return cases


SUITES = ("standard", "features", "na", "memory", "quick", "decode")
_BUILDERS = {
    ("standard", "cuda"): _standard_gpu, ("standard", "cpu"): _standard_cpu,
    ("features", "cuda"): _features_gpu, ("features", "cpu"): _features_cpu,
    ("na", "cuda"): _na_gpu, ("na", "cpu"): _na_cpu,
    ("memory", "cuda"): _memory_gpu, ("memory", "cpu"): _memory_cpu,
    ("quick", "cuda"): _quick_gpu, ("quick", "cpu"): _quick_cpu,
    ("decode", "cuda"): _decode_gpu, ("decode", "cpu"): _decode_cpu,
}


def suite_cases(suite: str, device: str) -> list:
    """The cases of a named suite sized for `device` ("cuda" or "cpu")."""
    if suite not in SUITES:
        raise ValueError(f"fmha.bench: unknown suite {suite!r}; available: {', '.join(SUITES)}")
    return _BUILDERS[(suite, "cuda" if device.startswith("cuda") else "cpu")]()


def is_memory_suite(suite: str) -> bool:
    return suite == "memory"


def is_decode_suite(suite: str) -> bool:
    return suite == "decode"
