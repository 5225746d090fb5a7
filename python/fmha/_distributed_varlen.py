"""Context parallelism over packed variable-length sequences (SPEC §8, §17): the documents of a
packed batch (fmha.attention_varlen's q [total_q, H, D] with cu_seqlens) sharded across the ranks
of a process group, forward and backward. fmha.distributed exports what is public here.

The machinery is fmha.distributed's: the same autograd.Function, the same ring and all-gather of
K/V (_kv_blocks), the same merge by lse and the same direct / merge backward. What differs is the
plan of the calls. A block is one document's query piece against one of its key pieces in hand,
masked by that document's band (its own diagonal: 0 top-left, Lk_b - Lq_b bottom-right), cut and
expressed as a window by fmha.distributed._block_call; the blocks of one K/V buffer then run as a
few fmha.attention_varlen calls, each block one sequence of a call (see _packed_calls), instead of
one call per document.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from . import _api
from . import _attention_ops as _ops
from ._arguments import to_bool, to_int
from ._distributed_layouts import _check_layout, _doc_pieces, _offsets, _world, varlen_segments
from .distributed import (
    _BACKWARD_MODE,
    _Call,
    _assemble,
    _band,
    _block_call,
    _checked_inputs,
    _form_by_estimate,
    _gather_lengths,
    _run,
)


# ---- The whole from shards -----------------------------------------------------------------------


def unshard_varlen(
    x: Tensor, cu_seqlens, group=None, *, layout: str = "contiguous", dim: int = 0
) -> Tensor:
    """The whole packed rows along dim from every rank's shard x (a collective: every rank calls it
    and gets the whole). Not differentiable."""
    cu = _offsets(cu_seqlens, "cu_seqlens")
    _check_layout(layout)
    world, _ = _world(group)
    dim = dim % x.dim()
    lengths = _gather_lengths(group, x.device, [x.shape[dim]])[0]
    segs = _checked_segments(cu, world, layout, lengths, "cu_seqlens", "rows")
    return _assemble(group, x, dim, lengths, segs)


def _checked_segments(cu: list, world: int, layout: str, lengths: list, cu_name: str,
                      what: str) -> list:
    """Every rank's segments of the packed batch `cu` in `layout`, after checking that the ranks'
    shard lengths are those segments' (ValueError naming cu_name and what the rows are)."""
    if sum(lengths) != cu[-1]:
        raise ValueError(f"fmha.distributed: the shards hold {sum(lengths)} {what}; {cu_name} says "
                         f"{cu[-1]}")  # fmt: skip
    segs = varlen_segments(cu, world, layout, lengths if layout == "contiguous" else None)
    for r, n in enumerate(lengths):
        if sum(length for _, length in segs[r]) != n:
            raise ValueError(f"fmha.distributed: rank {r} holds {n} {what}, not its {layout} "
                             f"shard of the packed batch")  # fmt: skip
    return segs


# ---- Calls of packed blocks ----------------------------------------------------------------------


def _offsets_on(offsets: tuple, device: torch.device) -> Tensor:
    """A call's sequence offsets (int32) on `device`. To a GPU from pinned memory without waiting:
    a copy from pageable memory would hold the host until the stream had run everything before it,
    and with it the overlap of the ring's transfers."""
    t = torch.tensor(offsets, dtype=torch.int32)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class _VarlenCall(NamedTuple):
    """One fmha.attention_varlen call of a step: rows q0..q1-1 of the local queries against rows
    k0..k1-1 of the K/V buffer in hand, cut into sequences by cu_q / cu_k (relative to q0 / k0),
    every sequence masked by one window aligned top-left or bottom-right (or none)."""

    q0: int
    q1: int
    k0: int
    k1: int
    window: Optional[tuple[int, int]]
    bottom_right: bool
    cu_q: tuple
    cu_k: tuple
    max_q: int
    max_k: int

    def _args(self, options, device):
        left, right = self.window if self.window is not None else (-1, -1)
        o = options._replace(window_left=left, window_right=right, bottom_right=self.bottom_right)
        cu_q, cu_k = (_offsets_on(x, device) for x in (self.cu_q, self.cu_k))
        return (cu_q, cu_k, self.max_q, self.max_k, False), o

    # The local buffers are [1, L, heads, dim] (distributed's dense plumbing); a call takes rows.
    def attend(self, options, q: Tensor, kb: Tensor, vb: Tensor) -> tuple[Tensor, Tensor]:
        """fmha.attention_varlen's forward of the call: (out, lse) of its rows, [1, ...]."""
        args, o = self._args(options, q.device)
        keys = slice(self.k0, self.k1)
        out, lse = _ops.forward(_ops._Varlen, q[0, self.q0 : self.q1], kb[0, keys], vb[0, keys],
                                args, o, fake=False)  # fmt: skip
        return out.unsqueeze(0), lse.unsqueeze(0)

    def grads(self, options, g_out, g_lse, q, kb, vb, b_out, b_lse) -> tuple:
        """fmha.attention_varlen's backward of the call: (dq, dk, dv) of its rows and keys."""
        args, o = self._args(options, q.device)
        keys = slice(self.k0, self.k1)
        grads = _ops.backward(
            _ops._Varlen, g_out[0], None if g_lse is None else g_lse[0], q[0, self.q0 : self.q1],
            kb[0, keys], vb[0, keys], b_out[0], b_lse[0], args, [False] * 6, o, fake=False,
            unasked=lambda: None,
        )  # fmt: skip
        return tuple(g.unsqueeze(0) for g in grads[:3])


def _alignment(c: _Call, left: int, right: int) -> tuple[bool, Optional[tuple[int, int]]]:
    """(bottom_right, window) that expresses block c's mask (the global band (left, right), cut
    by _block_call to a top-left window, or None). The same band is a bottom-right window
    (left - d + e, right + d - e), e = keys - queries, d the top-left offset, when both bounded
    ends stay >= 0. Of the two, the one with fewer nonzero ends is taken (bottom-right on a tie),
    so that most blocks of a step share one window and run in one call: causal blocks cut at the
    diagonal are bottom-right (-1, 0), sliding-window blocks (left + right, 0)."""
    if c.window is None:
        return False, None
    top_left = c.window
    d = left - top_left[0] if left >= 0 else top_left[1] - right
    e = (c.k1 - c.k0) - (c.q1 - c.q0)
    bottom = (left - d + e if left >= 0 else -1, right + d - e if right >= 0 else -1)
    valid = all(x >= 0 for x, end in zip(bottom, (left, right)) if end >= 0)
    if valid and sum(x > 0 for x in bottom) <= sum(x > 0 for x in top_left):
        return True, bottom
    return False, top_left


def _packed_calls(blocks: list[_Call], left: int, right: int) -> list[_VarlenCall]:
    """The blocks as a few varlen calls: blocks that share an alignment and window, in ascending
    order of both rows and keys with no overlap, are the sequences of one call; a gap between two
    of them becomes a sequence of queries without keys (out 0, lse -inf: merged with weight 0)
    and one of keys without queries. First fit, in the order of rows then keys."""
    groups: list[tuple[tuple, list[_Call]]] = []
    for c in sorted(blocks, key=lambda c: (c.q0, c.k0)):
        key = _alignment(c, left, right)
        for group_key, members in groups:
            if group_key == key and members[-1].q1 <= c.q0 and members[-1].k1 <= c.k0:
                members.append(c)
                break
        else:
            groups.append((key, [c]))
    calls = []
    for (bottom_right, window), members in groups:
        cu_q, cu_k = [0], [0]
        q, k = members[0].q0, members[0].k0
        for c in members:
            if c.q0 > q:
                cu_q.append(cu_q[-1] + c.q0 - q)
                cu_k.append(cu_k[-1])
            if c.k0 > k:
                cu_q.append(cu_q[-1])
                cu_k.append(cu_k[-1] + c.k0 - k)
            cu_q.append(cu_q[-1] + c.q1 - c.q0)
            cu_k.append(cu_k[-1] + c.k1 - c.k0)
            q, k = c.q1, c.k1
        longest_q = max(b - a for a, b in zip(cu_q, cu_q[1:]))
        longest_k = max(b - a for a, b in zip(cu_k, cu_k[1:]))
        calls.append(_VarlenCall(members[0].q0, q, members[0].k0, k, window, bottom_right,
                                 tuple(cu_q), tuple(cu_k), longest_q, longest_k))  # fmt: skip
    return calls


def _band_entries(c: _Call) -> int:
    """Visible score entries of a cut block (distributed._visible_entries in closed form): every
    row i of a cut block sees keys max(0, i - l) .. min(nk - 1, i + r), never none."""
    nq, nk = c.q1 - c.q0, c.k1 - c.k0
    if c.window is None:
        return nq * nk
    left, right = c.window
    if right < 0:
        hi = nq * (nk - 1)
    else:  # sum over i of min(nk - 1, i + right)
        m = max(0, min(nq, nk - right))
        hi = m * (m - 1) // 2 + right * m + (nk - 1) * (nq - m)
    t = max(0, nq - left - 1) if left >= 0 else 0  # sum over i of max(0, i - left)
    return hi - t * (t + 1) // 2 + nq


def _visible_entries(plan, q_pieces) -> int:
    """Visible score entries of the queries q_pieces against every key (the all-gather's)."""
    every_key = [(0, plan.cu_k[-1])]
    return sum(_band_entries(c) for c in plan._replace(q_pieces=q_pieces).blocks(every_key))


class _VarlenPlan(NamedTuple):
    """What fmha.distributed's forward and backward read of a plan (group .. options, backward),
    with the documents: this rank's query pieces and every document's key offsets and diagonal."""

    group: object
    world: int
    rank: int
    form: str
    k_segs: list  # per rank: (start, length) segments of the packed keys it holds
    k_lens: list  # per rank: rows of its K/V shard
    q_pieces: list  # this rank's (document, start in it, length, row) pieces of queries
    cu_k: list  # every document's key offsets
    diag: list  # every document's aligned diagonal: Lk_b - Lq_b for bottom-right, else 0
    left: int  # global window, causal folded in (-1: unbounded)
    right: int
    options: object  # _ops.Options of every call: no mask, no sinks
    backward: str = "merge"

    def blocks(self, k_segs_in_hand) -> list[_Call]:
        """Every (query piece, key piece) block of one document with something visible, cut."""
        by_doc: dict[int, list] = {}
        for doc, pos, n, row in _doc_pieces(k_segs_in_hand, self.cu_k):
            by_doc.setdefault(doc, []).append((pos, n, row))
        blocks = []
        for doc, q_pos, ql, q_row in self.q_pieces:
            for k_pos, kl, k_row in by_doc.get(doc, ()):
                delta = q_pos - k_pos + self.diag[doc]
                c = _block_call(q_row, ql, k_row, kl, delta, self.left, self.right)
                if c is not None:
                    blocks.append(c)
        return blocks

    def calls(self, k_segs_in_hand) -> list[_VarlenCall]:
        """This rank's calls against a K/V buffer holding k_segs_in_hand, in its order."""
        return _packed_calls(self.blocks(k_segs_in_hand), self.left, self.right)


@functools.lru_cache(maxsize=256)
def _auto_form(q_segs, k_segs, k_lens, cu_q, cu_k, diag, left, right, heads, kv_heads, d, dv,
               itemsize) -> str:
    """form='auto' for a packed batch: distributed's rule from the busiest rank's visible entries.
    Cached: a training loop's calls repeat their documents, and the count walks every one."""
    world = len(q_segs)
    if world == 1:
        return "ring"
    plan = _VarlenPlan(None, world, 0, "ring", list(k_segs), list(k_lens), [], list(cu_k),
                       list(diag), left, right, None)  # fmt: skip
    busiest = max(_visible_entries(plan, _doc_pieces(segs, list(cu_q))) for segs in q_segs)
    return _form_by_estimate(list(k_lens), busiest, heads, kv_heads, d, dv, itemsize)


# ---- The entry point -----------------------------------------------------------------------------


@torch.compiler.disable
def attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q: int,
    max_seqlen_k: int,
    group=None,
    *,
    layout: str = "contiguous",
    form: str = "auto",
    lengths: Optional[tuple[Sequence[int], Sequence[int]]] = None,
    scale: Optional[float] = None,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: Optional[tuple[int, int]] = None,
    softcap: float = 0.0,
    sinks: Optional[Tensor] = None,
    return_lse: bool = False,
    deterministic: bool = False,
    backward_impl: str = "auto",
    allow_tf32: bool = False,
    bias=None,
    rel_pos=None,
    extra_kv=None,
):
    """fmha.attention_varlen over a packed batch sharded across the ranks of group.

    q [total_q_r, H, D], k [total_k_r, Hkv, D], v [total_k_r, Hkv, Dv]: this rank's shards of
    the packed q, k, v in `layout` (varlen_segments; shard_varlen makes them). cu_seqlens_q /
    cu_seqlens_k [B + 1] and max_seqlen_q / max_seqlen_k are those of the WHOLE packed batch, the
    same on every rank (host lists or CPU tensors: a device tensor is read on the host, a
    synchronisation). Returns this rank's out [total_q_r, H, Dv] (and lse [H, total_q_r] with
    return_lse), exactly fmha.attention_varlen of the whole batch, sharded the same way. A
    collective, as attention.

    form, lengths (every rank's (q rows, k rows); by default one small all-gather learns them),
    scale, causal, causal_alignment (per document, as fmha.attention_varlen), window, softcap,
    sinks, deterministic, backward_impl and allow_tf32 as in attention. sinks.grad is this
    rank's part. bias, rel_pos and extra_kv are refused (NotImplementedError).
    """
    if extra_kv is not None:
        raise NotImplementedError("fmha.distributed: extra_kv (per-document extra keys) is not "
                                  "supported by attention_varlen")  # fmt: skip
    _check_layout(layout)
    q, k, v, sinks = _checked_inputs(q, k, v, sinks, form, bias, rel_pos, "[L, heads, dim]")
    return_lse = to_bool(return_lse, "return_lse")
    o = _api._options(scale, causal, causal_alignment, window, None, None, softcap, None, None,
                      deterministic, backward_impl, allow_tf32)  # fmt: skip
    cu_q, cu_k = _offsets(cu_seqlens_q, "cu_seqlens_q"), _offsets(cu_seqlens_k, "cu_seqlens_k")
    if len(cu_q) != len(cu_k):
        raise ValueError(f"fmha.distributed: cu_seqlens_q has {len(cu_q)} offsets and "
                         f"cu_seqlens_k {len(cu_k)}; both must be B + 1")  # fmt: skip
    for name, cu, longest in (("q", cu_q, max_seqlen_q), ("k", cu_k, max_seqlen_k)):
        longest = to_int(longest, f"max_seqlen_{name}")
        if any(b - a > longest for a, b in zip(cu, cu[1:])):
            raise ValueError(f"fmha.distributed: a sequence of cu_seqlens_{name} is longer than "
                             f"max_seqlen_{name} = {longest}")  # fmt: skip

    world, rank = _world(group)
    if lengths is None:
        q_lens, k_lens = _gather_lengths(group, q.device, [q.shape[0], k.shape[0]])
    else:
        q_lens, k_lens = ([int(n) for n in x] for x in lengths)
        if q_lens[rank] != q.shape[0] or k_lens[rank] != k.shape[0]:
            raise ValueError(f"fmha.distributed: lengths say rank {rank} holds {q_lens[rank]} "
                             f"queries and {k_lens[rank]} keys; it holds {q.shape[0]} and "
                             f"{k.shape[0]}")  # fmt: skip
    segs = [_checked_segments(cu, world, layout, lens, f"cu_seqlens_{name}", f"rows of {name}")
            for name, cu, lens in (("q", cu_q, q_lens), ("k", cu_k, k_lens))]  # fmt: skip
    left, right = _band(o)
    diag = [(kb - ka) - (qb - qa) if o.bottom_right else 0
            for qa, qb, ka, kb in zip(cu_q, cu_q[1:], cu_k, cu_k[1:])]  # fmt: skip
    block_options = o._replace(causal=False, bottom_right=False)
    plan = _VarlenPlan(group, world, rank, "ring", segs[1], k_lens,
                       _doc_pieces(segs[0][rank], cu_q), cu_k, diag, left, right,
                       block_options)  # fmt: skip
    if form == "auto":
        form = _auto_form(tuple(map(tuple, segs[0])), tuple(map(tuple, segs[1])), tuple(k_lens),
                          tuple(cu_q), tuple(cu_k), tuple(diag), left, right, q.shape[1],
                          k.shape[1], q.shape[2], v.shape[2], q.element_size())  # fmt: skip
    plan = plan._replace(form=form, backward=_BACKWARD_MODE.get(q.device.type, "merge"))
    out, lse = _run(plan, q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), sinks, None)
    return (out[0], lse[0]) if return_lse else out[0]
