"""The layouts of fmha.distributed (SPEC §17): which rows of a sequence each rank holds, and the
helpers that cut a rank's shard out of the whole. No transfers here (unshard and the collectives
are fmha.distributed's); fmha.distributed exports what is public."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

LAYOUTS = ("contiguous", "zigzag")


# ---- Layouts -------------------------------------------------------------------------------------


def _chunks(seq_len: int, count: int) -> list[tuple[int, int]]:
    """(start, length) of count near-equal chunks of seq_len; the first seq_len % count are one
    longer (torch.tensor_split's rule)."""
    base, extra = divmod(seq_len, count)
    bounds, start = [], 0
    for c in range(count):
        length = base + (1 if c < extra else 0)
        bounds.append((start, length))
        start += length
    return bounds


def layout_segments(
    seq_len: int,
    world_size: int,
    layout: str = "contiguous",
    lengths: Optional[Sequence[int]] = None,
) -> list[list[tuple[int, int]]]:
    """For every rank, the (start, length) segments of the sequence it holds, in the order its
    shard stores them.

    contiguous: rank r holds one piece, pieces in rank order; lengths gives each rank's length
    (any, zeros included; their sum is seq_len), default near-equal pieces.
    zigzag: the sequence is cut into 2W near-equal chunks and rank r holds chunks r and 2W-1-r
    (the head-tail layout that gives every rank the same causal work); lengths is refused.
    """
    _check_layout(layout)
    if lengths is not None:
        if layout != "contiguous":
            raise ValueError("fmha.distributed: lengths apply to the 'contiguous' layout only")
        lengths = [int(n) for n in lengths]
        if len(lengths) != world_size or min(lengths) < 0 or sum(lengths) != seq_len:
            raise ValueError(
                f"fmha.distributed: lengths {lengths} must be {world_size} values >= 0 summing to "
                f"the sequence length {seq_len}"
            )
        starts = [sum(lengths[:r]) for r in range(world_size)]
        return [[(s, n)] for s, n in zip(starts, lengths)]
    if layout == "contiguous":
        return [[c] for c in _chunks(seq_len, world_size)]
    chunks = _chunks(seq_len, 2 * world_size)
    return [[chunks[r], chunks[2 * world_size - 1 - r]] for r in range(world_size)]


def _check_layout(layout) -> None:
    if layout not in LAYOUTS:
        raise ValueError(
            f"fmha.distributed: layout is {layout!r}; accepted: 'contiguous', 'zigzag'"
        )


def _world(group) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def shard_positions(
    seq_len: int, group=None, *, layout: str = "contiguous", lengths=None, device=None
) -> Tensor:
    """The sequence positions (int64) of this rank's shard, in its order: e.g. for rotary
    embeddings of a zigzag shard."""
    world, rank = _world(group)
    segs = layout_segments(seq_len, world, layout, lengths)[rank]
    return torch.cat([torch.arange(s, s + n, device=device) for s, n in segs])


def shard(
    x: Tensor, group=None, *, layout: str = "contiguous", dim: int = 1, lengths=None
) -> Tensor:
    """This rank's shard (a copy) of x, the whole sequence along dim, which every rank holds."""
    world, rank = _world(group)
    segs = layout_segments(x.shape[dim], world, layout, lengths)[rank]
    return torch.cat([x.narrow(dim, s, n) for s, n in segs], dim)
