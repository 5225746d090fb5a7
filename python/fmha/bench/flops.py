"""Exact FLOP counts over visible score entries only.

Forward: each visible (query, key) pair costs one D-long dot product for the score and one Dv-long
multiply-add into the output: 2 * (D + Dv) FLOPs. Masked pairs cost nothing, whatever a kernel
really computes for them, so a kernel that wastes work on masked tiles shows a lower rate.
Backward: 2.5x forward by convention (the five backward matmuls against the two forward ones).
"""
from __future__ import annotations

import torch

from .cases import BACKWARD_FLOP_FACTOR, Case


def dense_visible_pairs(lq: int, lk: int, causal: bool, window) -> int:
    """Visible pairs of one (batch, head) under causal / window masks, top-left aligned (SPEC §3)."""
    if lq == 0 or lk == 0:
        return 0
    i = torch.arange(lq, dtype=torch.int64)
    lo = torch.zeros_like(i)
    hi = torch.full_like(i, lk - 1)
    if causal:
        hi = torch.minimum(hi, i)
    if window is not None:
        left, right = window
        if left >= 0:
            lo = torch.maximum(lo, i - left)
        if right >= 0:
            hi = torch.minimum(hi, i + right)
    return int((hi - lo + 1).clamp_min(0).sum())


def na_axis_visible_count(length: int, kernel: int, dilation: int, causal: bool) -> int:
    """Sum over the query coordinates of one NA axis of the number of keys visible on that axis.

    Non-causal: always `kernel` (the window shifts inward at borders, and kernel * dilation <=
    length guarantees every dilation group holds at least `kernel` coordinates).
    Causal: min(p + 1, kernel) for the position p = x div dilation inside the query's group.
    """
    if not causal:
        return length * kernel
    positions = torch.arange(length, dtype=torch.int64) // dilation
    return int(torch.clamp(positions + 1, max=kernel).sum())


def na_visible_pairs(case: Case) -> int:
    """Visible pairs of one (batch, head) of an NA case.

    A query's neighborhood is the Cartesian product of its per-axis neighborhoods, so the sum over
    all queries of the product of per-axis counts factorises into the product of per-axis sums.
    """
    total = 1
    for axis, length in enumerate(case.grid):
        total *= na_axis_visible_count(length, case.kernel[axis], case.dilation[axis],
                                       case.na_causal[axis])
    return total


def visible_pairs(case: Case) -> int:
    """Visible (query, key) pairs summed over batch and heads."""
    if case.kind == "na":
        per_head = case.B * na_visible_pairs(case)
    elif case.kind == "varlen":
        per_head = sum(dense_visible_pairs(n, n, case.causal, case.window) for n in case.seqlens)
    else:
        per_head = case.B * dense_visible_pairs(case.Lq, case.Lk, case.causal, case.window)
    return per_head * case.H


def forward_flops(case: Case) -> int:
    return 2 * visible_pairs(case) * (case.D + case.dv)


def direction_flops(case: Case, direction: str) -> float:
    fwd = forward_flops(case)
    if direction == "fwd":
        return float(fwd)
    if direction == "bwd":
        return BACKWARD_FLOP_FACTOR * fwd
    if direction == "fwd+bwd":
        return (1.0 + BACKWARD_FLOP_FACTOR) * fwd
    raise ValueError(f"fmha.bench: unknown direction {direction!r}")


def bytes_moved(case: Case, element_size: int) -> int:
    """Bytes a decode call must move at least: every key and value of the cache read once, the
    queries read and the output written once (what bounds a decode kernel, not its FLOPs)."""
    cache = case.B * case.Lk * case.hkv * (case.D + case.dv)
    queries_and_out = case.B * case.Lq * case.H * (case.D + case.dv)
    return (cache + queries_and_out) * element_size
