"""Visibility of key j to query i (SPEC §3, §6, §8), written once with broadcasting torch ops.

The same functions serve the materialised reference (called on index grids), FlexAttention's
mask_mod (called on scalar index tensors inside the compiled kernel) and the exact FLOP count.
Every function takes integer tensors and returns a bool tensor; none uses Python control flow on
tensor values, so FlexAttention can trace them.
"""
from __future__ import annotations

import torch

from .cases import Case


def dense_visible(case: Case, q_idx, kv_idx):
    """causal / window visibility (SPEC §3) for query positions q_idx and key positions kv_idx.

    Positions are inside one sequence (varlen: inside its own). Every suite case uses the top-left
    alignment, d(i) = i; bottom-right would equal it anyway because the suites keep Lq == Lk.
    """
    diagonal = q_idx
    visible = torch.ones_like(q_idx - kv_idx, dtype=torch.bool)
    if case.causal:
        visible = visible & (kv_idx <= diagonal)
    if case.window is not None:
        left, right = case.window
        if left >= 0:
            visible = visible & (kv_idx >= diagonal - left)
        if right >= 0:
            visible = visible & (kv_idx <= diagonal + right)
    return visible


def _na_axis_visible(xq, xk, length: int, kernel: int, dilation: int, causal: bool):
    """SPEC §6 on one axis: is key coordinate xk in the neighborhood of query coordinate xq."""
    group = xq % dilation
    pos = xq // dilation
    group_len = (length - group + dilation - 1) // dilation
    t = xk // dilation
    same_group = (xk % dilation) == group
    if causal:
        return same_group & (t <= pos) & (t >= pos - kernel + 1)
    start = pos - kernel // 2
    start = torch.where(start < 0, 0, start)
    start = torch.where(start > group_len - kernel, group_len - kernel, start)
    return same_group & (t >= start) & (t < start + kernel)


def na_visible(case: Case, q_idx, kv_idx):
    """Neighborhood visibility over the flattened (row-major) token grid of an NA case."""
    visible = None
    inner = 1
    for axis in reversed(range(len(case.grid))):
        length = case.grid[axis]
        xq = (q_idx // inner) % length
        xk = (kv_idx // inner) % length
        axis_visible = _na_axis_visible(xq, xk, length, case.kernel[axis], case.dilation[axis],
                                        case.na_causal[axis])
        visible = axis_visible if visible is None else visible & axis_visible
        inner *= length
    return visible


def visible(case: Case, q_idx, kv_idx):
    """Visibility for a dense or NA case (varlen sequences use dense_visible with their lengths)."""
    if case.kind == "na":
        return na_visible(case, q_idx, kv_idx)
    return dense_visible(case, q_idx, kv_idx)


def has_mask(case: Case) -> bool:
    return case.kind in ("na", "varlen") or case.causal or case.window is not None
