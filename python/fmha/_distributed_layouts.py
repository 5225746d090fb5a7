"""The layouts of fmha.distributed (SPEC §17): which rows of a sequence, or of a packed batch of
documents (SPEC §8), each rank holds, and the helpers that cut a rank's shard out of the whole.
No transfers here (unshard and the collectives are fmha.distributed's, unshard_varlen
_distributed_varlen's); fmha.distributed exports what is public."""

from __future__ import annotations

import bisect
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ._arguments import to_int

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


# ---- Layouts of packed documents -----------------------------------------------------------------


def _offsets(cu_seqlens, name: str) -> list[int]:
    """cu_seqlens (a 1-D tensor or a sequence of ints) as a host list, checked: ascending from 0.
    A device tensor is copied to the host (a synchronisation)."""
    if isinstance(cu_seqlens, Tensor):
        if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
            raise ValueError(f"fmha.distributed: {name} must be a 1-D integer tensor; got "
                             f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")  # fmt: skip
        values = cu_seqlens.tolist()
    else:
        values = [to_int(x, name) for x in cu_seqlens]
    if not values or values[0] != 0 or any(b < a for a, b in zip(values, values[1:])):
        shown = values if len(values) <= 12 else values[:12] + ["..."]
        raise ValueError(f"fmha.distributed: {name} is {shown}; expected offsets ascending from 0")
    return values


def varlen_segments(
    cu_seqlens, world_size: int, layout: str = "contiguous", lengths: Optional[Sequence[int]] = None
) -> list[list[tuple[int, int]]]:
    """For every rank, the (start, length) segments of the packed rows it holds, in its order: the
    twin of layout_segments for a packed batch with offsets cu_seqlens [B + 1].

    contiguous: the packed rows cut into W pieces as layout_segments cuts a sequence (lengths:
    every rank's rows, default near-equal); documents may cross shard boundaries.
    zigzag: every document cut into 2W near-equal chunks, rank r holds chunks r and 2W-1-r of
    every document, documents in order (a document shorter than 2W leaves some ranks nothing of
    it: zero-length segments). lengths is refused.
    """
    cu = _offsets(cu_seqlens, "cu_seqlens")
    _check_layout(layout)
    if layout == "contiguous" or lengths is not None:
        return layout_segments(cu[-1], world_size, layout, lengths)
    segs = [[] for _ in range(world_size)]
    for start, end in zip(cu, cu[1:]):
        chunks = _chunks(end - start, 2 * world_size)
        for r in range(world_size):
            for s, n in (chunks[r], chunks[2 * world_size - 1 - r]):
                segs[r].append((start + s, n))
    return segs


def _doc_pieces(segs, cu: list[int]) -> list[tuple[int, int, int, int]]:
    """(document, start in the document, length, row in the buffer) of every non-empty piece of
    a buffer that holds the packed segments segs in order, cut at the documents' boundaries."""
    pieces, row = [], 0
    for start, n in segs:
        pos, end = start, start + n
        doc = bisect.bisect_right(cu, pos) - 1
        while pos < end:
            while cu[doc + 1] <= pos:  # empty documents
                doc += 1
            take = min(end, cu[doc + 1]) - pos
            pieces.append((doc, pos - cu[doc], take, row + pos - start))
            pos += take
        row += n
    return pieces


def _rank_segments(cu_seqlens, group, layout, lengths):
    world, rank = _world(group)
    return varlen_segments(cu_seqlens, world, layout, lengths)[rank]


def shard_varlen(
    x: Tensor, cu_seqlens, group=None, *, layout: str = "contiguous", dim: int = 0, lengths=None
) -> Tensor:
    """This rank's shard (a copy) of x, the whole packed rows along dim, which every rank holds."""
    cu = _offsets(cu_seqlens, "cu_seqlens")
    if x.shape[dim] != cu[-1]:
        raise ValueError(f"fmha.distributed: x has {x.shape[dim]} rows along dim {dim}; "
                         f"cu_seqlens says {cu[-1]}")  # fmt: skip
    segs = [(s, n) for s, n in _rank_segments(cu, group, layout, lengths) if n]
    if not segs:
        return x.narrow(dim, 0, 0).clone()
    return torch.cat([x.narrow(dim, s, n) for s, n in segs], dim)


def shard_positions_varlen(
    cu_seqlens, group=None, *, layout: str = "contiguous", lengths=None, device=None
) -> Tensor:
    """The position inside its document (int64) of every row of this rank's shard, in its order:
    e.g. for rotary embeddings of a packed shard."""
    cu = _offsets(cu_seqlens, "cu_seqlens")
    segs = _rank_segments(cu, group, layout, lengths)
    rows = torch.cat([torch.zeros(0, dtype=torch.int64)]
                     + [torch.arange(s, s + n) for s, n in segs if n])  # fmt: skip
    starts = torch.tensor(cu, dtype=torch.int64)
    doc = torch.searchsorted(starts, rows, right=True) - 1
    return (rows - starts[doc]).to(device)


def shard_cu_seqlens(
    cu_seqlens, group=None, *, layout: str = "contiguous", lengths=None, device=None
) -> Tensor:
    """The offsets [B + 1] (int32) of every document's rows in this rank's shard: document b's
    rows here are rows cu[b] .. cu[b + 1] - 1 of the shard, in the shard's order (zigzag: its two
    chunks one after the other); a document with no row here has length 0."""
    cu = _offsets(cu_seqlens, "cu_seqlens")
    counts = [0] * (len(cu) - 1)
    for doc, _, n, _ in _doc_pieces(_rank_segments(cu, group, layout, lengths), cu):
        counts[doc] += n
    local = [0]
    for n in counts:
        local.append(local[-1] + n)
    return torch.tensor(local, dtype=torch.int32, device=device)
