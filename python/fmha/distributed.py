"""Context parallelism: one attention over a sequence sharded across the ranks of a process group
(SPEC §17), forward and backward, on torch.distributed (NCCL on GPUs, gloo on CPUs).

Every rank holds a shard of the sequence of q and one of k/v (dimension 1 of [B, L, H, D]) in a
named layout, calls `attention` with the same options, and gets the out (and lse) of its own
queries; the backward returns each rank the gradients of its own shards. Two forms move K/V:

- ring: K/V go rank to rank (batch_isend_irecv to the next rank while the current block computes);
  the backward sends the dK/dV accumulators around with them. Memory per rank: its own shard
  plus one block in flight.
- allgather: K/V are all-gathered once and the local queries run against the whole sequence in
  one call per query segment; the backward reduce-scatters dK/dV. Memory: the whole K/V.

Each block is computed by fmha's own kernels (out + lse) and merged by SPEC §12's rule in fp32;
the backward is a custom autograd.Function that recomputes every block with fmha's backward. On
CUDA each block's backward gets the merged out and lse (and dlse), so nothing per block is kept
and memory does not grow with the number of ranks; on other devices it gets the chain rule
through the merge, from each block's own out and lse kept from the forward (_block_grads says
why). docs/distributed.md has the details, the rule between the forms and the limits.

attention_varlen does the same for packed variable-length sequences (fmha.attention_varlen's
documents, cut by the layout per document or across them) on this machinery with its own plan
(_distributed_varlen.py). The layouts and the shard helpers live in _distributed_layouts.py.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from . import _api
from . import _attention_ops as _ops
from ._arguments import pair, to_bool
from ._distributed_layouts import (
    LAYOUTS,
    _check_layout,
    _world,
    layout_segments,
    shard,
    shard_cu_seqlens,
    shard_positions,
    shard_positions_varlen,
    shard_varlen,
    varlen_segments,
)

FORMS = ("auto", "ring", "allgather")

# The rule between the forms (choose_form). The all-gather cannot hide its transfer, the ring
# can (behind each step's block) but pays W merges and W smaller calls. All-gather is taken when
# its exposed transfer is estimated below _ALLGATHER_EXPOSED_SHARE of the attention's time, with
# time = bytes / link rate and flops / attention rate. Rates measured by bench/context_parallel.py
# on H200s over NVLink (bf16, D 128, causal, S 128k, 2026-11-28): the blocks' attention without
# transfers at 556-641 TFLOP/s, the all-gather form's transfers alone at 72-116 GB/s received a
# GPU. The share is set between the measured cells: all-gather won at an estimated 2.3% (GQA 32/8
# on 2 GPUs, 1.01x the ring) and 7.0% (GQA on 4 GPUs, 1.08x: the ring hid none of its transfers
# there), the ring at 9.4% (MHA 16/16 on 2 GPUs, 1.01x).
_ATTENTION_FLOP_PER_LINK_BYTE = 590e12 / 110e9
_ALLGATHER_EXPOSED_SHARE = 0.08

# How each device's blocks get their gradients (_block_grads): the CUDA backend's backward reads
# Delta from the given out and P from the given lse, so its blocks take the merged ones and
# nothing per block is kept; other backends take the merge's chain rule with each block's own
# out and lse, kept from the forward (memory: one out per call).
_BACKWARD_MODE = {"cuda": "direct"}

_KV_TAG, _DKV_TAG = 17, 18  # gloo matches point-to-point messages by tag; NCCL ignores them


# ---- Shards to the whole, and the collectives ----------------------------------------------------


def unshard(x: Tensor, group=None, *, layout: str = "contiguous", dim: int = 1) -> Tensor:
    """The whole sequence along dim from every rank's shard x (a collective: every rank calls it
    and gets the whole). Shards may have different lengths. Not differentiable."""
    _check_layout(layout)
    world, rank = _world(group)
    dim = dim % x.dim()
    lengths = _gather_lengths(group, x.device, [x.shape[dim]])[0]
    layout_lengths = lengths if layout == "contiguous" else None
    segs = layout_segments(sum(lengths), world, layout, layout_lengths)
    for r, n in enumerate(lengths):
        if sum(length for _, length in segs[r]) != n:
            raise ValueError(
                f"fmha.distributed: rank {r} holds {n} rows, not a {layout} shard of a sequence of "
                f"{sum(lengths)}"
            )
    return _assemble(group, x, dim, lengths, segs)


def _assemble(group, x: Tensor, dim: int, lengths: list[int], segs) -> Tensor:
    """The whole sequence along dim from every rank's shard x: lengths[r] rows on rank r, holding
    the (start, length) segments segs[r] in its order."""
    moved = x.movedim(dim, 0)
    gathered = _all_gather_padded(group, moved.contiguous(), lengths)
    pieces = []
    for r, rank_segs in enumerate(segs):
        offset = 0
        for start, n in rank_segs:
            pieces.append((start, gathered[r][offset : offset + n]))
            offset += n
    pieces.sort(key=lambda p: p[0])
    return torch.cat([p for _, p in pieces], 0).movedim(0, dim)


def _gather_lengths(group, device, local: list[int]) -> list[list[int]]:
    """For each value of local, its value on every rank (one small all-gather)."""
    world, _ = _world(group)
    mine = torch.tensor(local, dtype=torch.int64, device=device)
    every = torch.empty(world * len(local), dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(every, mine, group=group)
    rows = every.view(world, len(local)).tolist()
    return [[row[i] for row in rows] for i in range(len(local))]


def _all_gather_padded(group, x: Tensor, lengths: list[int]) -> Tensor:
    """[W, max_len, ...]: every rank's x (rows along dim 0, lengths[r] of them) padded to the
    longest: all_gather needs equal sizes."""
    world, _ = _world(group)
    longest = max(lengths)
    padded = x
    if x.shape[0] != longest:
        padded = x.new_zeros((longest, *x.shape[1:]))
        padded[: x.shape[0]] = x
    out = x.new_empty((world * longest, *x.shape[1:]))
    dist.all_gather_into_tensor(out, padded.contiguous(), group=group)
    return out.view(world, longest, *x.shape[1:])


def _exchange(group, to_rank: int, sends, from_rank: int, recvs, tag: int):
    """Posts sends to to_rank and receives from from_rank (group ranks), all at once; returns the
    requests. Empty tensors are not sent: both ends know every length. With NCCL the transfers
    run on its own streams, which wait for the current stream's writes when posted; waiting on a
    request makes the current stream wait for the transfer, so the blocks computed in between
    overlap it."""
    def peer(r: int) -> int:
        return r if group is None else dist.get_global_rank(group, r)

    ops = [dist.P2POp(dist.isend, t, peer(to_rank), group, tag) for t in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, peer(from_rank), group, tag) for t in recvs if t.numel()]
    return dist.batch_isend_irecv(ops) if ops else []


def _wait(requests) -> None:
    for r in requests:
        r.wait()


# ---- Masks of blocks -----------------------------------------------------------------------------


class _Call(NamedTuple):
    """One fmha call of a step: query rows q0..q1-1 of the local shard against rows k0..k1-1 of
    the K/V block in hand, with a top-left window (or none: every key visible)."""

    q0: int
    q1: int
    k0: int
    k1: int
    window: Optional[tuple[int, int]]

    def _options(self, options):
        left, right = self.window if self.window is not None else (-1, -1)
        return options._replace(window_left=left, window_right=right)

    def attend(self, options, q: Tensor, kb: Tensor, vb: Tensor) -> tuple[Tensor, Tensor]:
        """fmha's forward of the call: (out, lse) of its rows."""
        rows, keys = slice(self.q0, self.q1), slice(self.k0, self.k1)
        return _ops.forward(_ops._Dense, q[:, rows], kb[:, keys], vb[:, keys], (),
                            self._options(options), fake=False)  # fmt: skip

    def grads(self, options, g_out, g_lse, q, kb, vb, b_out, b_lse) -> tuple:
        """fmha's backward of the call: (dq, dk, dv) of its rows and keys, from the gradients
        g_out, g_lse and the (out, lse) b_out, b_lse of its rows."""
        rows, keys = slice(self.q0, self.q1), slice(self.k0, self.k1)
        return _ops.backward(
            _ops._Dense, g_out, g_lse, q[:, rows], kb[:, keys], vb[:, keys], b_out, b_lse, (),
            [False] * 6, self._options(options), fake=False, unasked=lambda: None,
        )[:3]  # fmt: skip


def _block_call(q_base, ql, k_base, kl, delta, left, right) -> Optional[_Call]:
    """The call of a block of ql queries and kl keys in which query i sees key j iff
    i + delta - left <= j <= i + delta + right (left/right -1: unbounded), or None when the block
    is fully masked. Queries and keys that see / are seen by nothing are cut off, which leaves an
    offset that fmha's top-left window expresses: left' = left - d, right' = right + d, both >= 0.
    q_base / k_base: where the block starts in the local buffers."""
    if ql <= 0 or kl <= 0:
        return None
    q_lo, q_hi, k_lo, k_hi = 0, ql, 0, kl
    if right >= 0:
        q_lo = max(0, -(delta + right))  # rows that see no key: all keys lie to their right
        k_hi = min(kl, ql + delta + right)  # keys right of the last row's reach
    if left >= 0:
        k_lo = max(0, delta - left)  # keys left of the first row's reach
        q_hi = min(ql, kl - delta + left)  # rows whose reach starts past the last key
    if q_lo >= q_hi or k_lo >= k_hi:
        return None
    d = delta + q_lo - k_lo
    nq, nk = q_hi - q_lo, k_hi - k_lo
    every_key_left = right < 0 or nk - 1 <= d + right  # the first row sees the last key
    every_key_right = left < 0 or nq - 1 + d - left <= 0  # the last row sees the first key
    window = None
    if not (every_key_left and every_key_right):
        window = (left - d if left >= 0 else -1, right + d if right >= 0 else -1)
    return _Call(q_base + q_lo, q_base + q_hi, k_base + k_lo, k_base + k_hi, window)


def _fuse(calls: list[_Call]) -> list[_Call]:
    """Joins unmasked calls that are adjacent in the local buffers (same keys and consecutive
    rows, or the reverse) into one: fewer, larger calls and fewer merges (e.g. the zigzag layout's
    causal steps, one call each instead of two)."""
    calls = list(calls)
    joined = True
    while joined:
        joined = False
        for a in range(len(calls)):
            for b in range(len(calls)):
                x, y = calls[a], calls[b]
                if a == b or x.window is not None or y.window is not None:
                    continue
                if (x.k0, x.k1) == (y.k0, y.k1) and x.q1 == y.q0:
                    calls[a] = _Call(x.q0, y.q1, x.k0, x.k1, None)
                elif (x.q0, x.q1) == (y.q0, y.q1) and x.k1 == y.k0:
                    calls[a] = _Call(x.q0, x.q1, x.k0, y.k1, None)
                else:
                    continue
                del calls[b]
                joined = True
                break
            if joined:
                break
    return calls


def _visible_entries(call: _Call) -> int:
    nq, nk = call.q1 - call.q0, call.k1 - call.k0
    if call.window is None:
        return nq * nk
    left, right = call.window
    i = torch.arange(nq, dtype=torch.int64)
    lo = (i - left).clamp(min=0) if left >= 0 else torch.zeros_like(i)
    hi = (i + right).clamp(max=nk - 1) if right >= 0 else torch.full_like(i, nk - 1)
    return int((hi - lo + 1).clamp(min=0).sum())


# ---- The plan of a call --------------------------------------------------------------------------


class _Plan(NamedTuple):
    group: object
    world: int
    rank: int
    form: str
    q_segs: list  # per rank: (start, length) segments of its queries
    k_segs: list  # per rank: those of its keys
    k_lens: list  # per rank: rows of its K/V shard
    diag: int  # global offset of the aligned diagonal: Lk - Lq for bottom-right causal
    left: int  # global window, causal folded in (-1: unbounded)
    right: int
    options: object  # _ops.Options of every block call: no mask, no sinks
    backward: str = "merge"  # 'direct' or 'merge': how blocks get their gradients (_block_grads)

    def calls(self, k_segs_in_hand) -> list[_Call]:
        """This rank's calls against a K/V buffer holding k_segs_in_hand, in its order."""
        calls, q_base = [], 0
        for q_start, ql in self.q_segs[self.rank]:
            k_base = 0
            for k_start, kl in k_segs_in_hand:
                delta = q_start - k_start + self.diag
                call = _block_call(q_base, ql, k_base, kl, delta, self.left, self.right)
                if call is not None:
                    calls.append(call)
                k_base += kl
            q_base += ql
        return _fuse(calls)


def _kv_blocks(plan: _Plan, k: Tensor, v: Tensor):
    """Yields (k_segs, k, v) of every K/V block this rank computes against: the ring's W steps
    (the next block's transfer runs while the caller computes on the current one) or the
    all-gather's one block, the whole sequence in order."""
    if plan.form == "allgather":
        full_k, full_v = _gather_sequence(plan, k, v)
        yield [(0, sum(plan.k_lens))], full_k, full_v
        return
    nxt, prev = (plan.rank + 1) % plan.world, (plan.rank - 1) % plan.world
    if plan.world > 1:  # transfers take dense tensors (the receive buffers are)
        k, v = k.contiguous(), v.contiguous()
    for step in range(plan.world):
        src = (plan.rank - step) % plan.world
        requests, incoming = [], None
        if step + 1 < plan.world:
            rows = plan.k_lens[(plan.rank - step - 1) % plan.world]
            incoming = (k.new_empty((k.shape[0], rows, *k.shape[2:])),
                        v.new_empty((v.shape[0], rows, *v.shape[2:])))  # fmt: skip
            requests = _exchange(plan.group, nxt, (k, v), prev, incoming, _KV_TAG)
        yield plan.k_segs[src], k, v
        _wait(requests)
        if incoming is not None:
            k, v = incoming


def _natural_order(plan: _Plan, device) -> Tensor:
    """For every key position, its row in the gathered [W * longest] buffer."""
    longest = max(plan.k_lens)
    rows = torch.empty(sum(plan.k_lens), dtype=torch.int64)
    for r, segs in enumerate(plan.k_segs):
        offset = r * longest
        for start, n in segs:
            rows[start : start + n] = torch.arange(offset, offset + n)
            offset += n
    return rows.to(device)


def _gather_sequence(plan: _Plan, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """The whole K and V, in sequence order, on every rank."""
    order = _natural_order(plan, k.device)
    out = []
    for x in (k, v):
        gathered = _all_gather_padded(plan.group, x.transpose(0, 1), plan.k_lens)  # [W, n, B, ..]
        flat = gathered.flatten(0, 1).index_select(0, order)
        out.append(flat.transpose(0, 1))
    return out[0], out[1]


def _scatter_sequence_grad(plan: _Plan, grad: Tensor) -> Tensor:
    """Each rank's shard of the sum over ranks of grad (the whole sequence in order)."""
    longest = max(plan.k_lens)
    order = _natural_order(plan, grad.device)
    rows = grad.transpose(0, 1)  # [Lk, B, ...]
    padded = rows.new_zeros((plan.world * longest, *rows.shape[1:]))
    padded.index_copy_(0, order, rows)
    mine = rows.new_empty((longest, *rows.shape[1:]))
    dist.reduce_scatter_tensor(mine, padded, group=plan.group)
    return mine[: plan.k_lens[plan.rank]].transpose(0, 1)


# ---- Forward and backward ------------------------------------------------------------------------


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _merge_into(out_acc: Tensor, lse_acc: Tensor, out: Tensor, lse: Tensor) -> None:
    """SPEC §12 in place on views of the accumulators; -inf parts weigh 0, never NaN."""
    lse = lse.to(lse_acc.dtype)
    merged = torch.logaddexp(lse_acc, lse)
    safe = torch.where(torch.isneginf(merged), torch.zeros_like(merged), merged)
    w_acc = torch.exp(lse_acc - safe).transpose(1, 2).unsqueeze(-1)
    w_new = torch.exp(lse - safe).transpose(1, 2).unsqueeze(-1)
    out_acc.mul_(w_acc).addcmul_(out, w_new)  # out in its own dtype: no fp32 copy of it
    lse_acc.copy_(merged)


def _extra_call(q: Tensor, extra) -> Optional[_Call]:
    """The call of the extra keys (SPEC §7: every query sees them, unmasked), or None."""
    if extra is None or q.shape[1] == 0 or extra[0].shape[1] == 0:
        return None
    return _Call(0, q.shape[1], 0, extra[0].shape[1], None)


def _forward(plan: _Plan, q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor], extra,
             keep_blocks: bool):  # fmt: skip
    """(out, lse, blocks): blocks holds every call's own (out, lse) in call order when
    keep_blocks (the 'merge' backward needs them), else None. extra: (extra_k, extra_v) or None."""
    B, Lq, H, _ = q.shape
    acc = _acc_dtype(q.dtype)
    out_acc = q.new_zeros((B, Lq, H, v.shape[-1]), dtype=acc)
    lse_acc = q.new_full((B, H, Lq), -math.inf, dtype=acc)
    blocks = [] if keep_blocks else None
    written = torch.zeros(Lq, dtype=torch.bool)  # rows that hold a part already (host side)

    def run(c: _Call, kb: Tensor, vb: Tensor) -> None:
        out, lse = c.attend(plan.options, q, kb, vb)
        if written[c.q0 : c.q1].any():  # (rows not written yet hold 0 and -inf: merged alike)
            _merge_into(out_acc[:, c.q0 : c.q1], lse_acc[:, :, c.q0 : c.q1], out, lse)
        else:  # the rows' first part: the merge with nothing is a copy
            out_acc[:, c.q0 : c.q1] = out
            lse_acc[:, :, c.q0 : c.q1] = lse
        written[c.q0 : c.q1] = True
        if keep_blocks:
            blocks.append((out, lse))

    extra_call = _extra_call(q, extra)
    if extra_call is not None:  # first, before any transfer: one call of every local query
        run(extra_call, *extra)
    for k_segs, kb, vb in _kv_blocks(plan, k, v):
        for c in plan.calls(k_segs):
            run(c, kb, vb)
    if sinks is not None:
        # Applied once, to the merged result: the sink joins every query's normaliser once.
        sink = sinks.to(acc).view(1, H, 1)
        with_sink = torch.logaddexp(lse_acc, sink)
        out_acc.mul_(torch.exp(lse_acc - with_sink).transpose(1, 2).unsqueeze(-1))
        lse_acc = with_sink
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return out_acc.to(q.dtype), lse_acc.to(lse_dtype), blocks


def _row_dot(a: Tensor, b: Tensor, acc: torch.dtype) -> Tensor:
    """sum over the last dim of a * b, [B, L, H, *] -> [B, H, L], in acc."""
    return (a.to(acc) * b.to(acc)).sum(-1).transpose(1, 2)


def _block_grads(plan, c, kb, vb, q, dout, dlse, out, lse, delta, block):
    """One call's (dq, dk, dv) through fmha's backward.

    direct (block None): the call's backward gets the merged out and lse (and the caller's dout,
    dlse), so that its probabilities and Delta = dout . out - dlse are the global ones: the
    standard ring-attention backward. It needs a backward that reads Delta from the given out
    and P from the given lse, which the CUDA backend does (its preprocess).
    merge (block = the call's own (out_b, lse_b)): the chain rule through SPEC §12's merge; with
    w = exp(lse_b - lse) the call's inputs get dout_b = w dout and
    dlse_b = w (dout . out_b - Delta), consistent (out, lse) for any backend, the CPU ones
    included (which recompute Delta, or all of out, from the call's own keys)."""
    rows = slice(c.q0, c.q1)
    if block is None:
        g_out, g_lse = dout[:, rows], None if dlse is None else dlse[:, :, rows]
        b_out, b_lse = out[:, rows], lse[:, :, rows]
    else:
        b_out, b_lse = block
        acc = delta.dtype
        weight = torch.exp(b_lse.to(acc) - lse[:, :, rows].to(acc))
        weight = torch.where(torch.isneginf(b_lse), torch.zeros_like(weight), weight)
        g_out = (dout[:, rows].to(acc) * weight.transpose(1, 2).unsqueeze(-1)).to(dout.dtype)
        g_lse = (weight * (_row_dot(dout[:, rows], b_out, acc) - delta[:, :, rows])).to(b_lse.dtype)
    return c.grads(plan.options, g_out, g_lse, q, kb, vb, b_out, b_lse)


def _backward(plan: _Plan, dout, dlse, q, k, v, out, lse, sinks, need_sinks: bool, extra, blocks):
    """dq, dk, dv, dsinks, dextra_k, dextra_v from every block's backward (_block_grads): the
    blocks' dq add up on this rank; their dk/dv add up over the ranks (SPEC §11). dsinks and the
    extra keys' gradients are this rank's parts."""
    acc = _acc_dtype(q.dtype)
    delta = _row_dot(dout, out, acc)  # Delta = dout . out - dlse, [B, H, Lq]
    if dlse is not None:
        delta = delta - dlse.to(acc)
    dq_acc = torch.zeros_like(q, dtype=acc)
    world, rank = plan.world, plan.rank
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    grad_requests, in_flight, incoming = [], None, None
    dk = dv = None
    block_iter = iter(blocks) if blocks is not None else None
    dextra = (None, None)
    if extra is not None:
        extra_call = _extra_call(q, extra)
        if extra_call is None:
            dextra = (torch.zeros_like(extra[0]), torch.zeros_like(extra[1]))
        else:
            block = next(block_iter) if block_iter is not None else None
            dq_c, *dextra = _block_grads(plan, extra_call, *extra, q, dout, dlse, out, lse, delta,
                                         block)  # fmt: skip
            dq_acc += dq_c
    for step, (k_segs, kb, vb) in enumerate(_kv_blocks(plan, k, v)):
        dk_part = torch.zeros_like(kb, dtype=acc)
        dv_part = torch.zeros_like(vb, dtype=acc)
        for c in plan.calls(k_segs):
            block = next(block_iter) if block_iter is not None else None
            dq_c, dk_c, dv_c = _block_grads(plan, c, kb, vb, q, dout, dlse, out, lse, delta, block)
            dq_acc[:, c.q0 : c.q1] += dq_c
            dk_part[:, c.k0 : c.k1] += dk_c
            dv_part[:, c.k0 : c.k1] += dv_c
        if plan.form == "allgather":
            dk = _scatter_sequence_grad(plan, dk_part)
            dv = _scatter_sequence_grad(plan, dv_part)
            continue
        if world == 1:
            dk, dv = dk_part, dv_part
            continue
        # The accumulators of this block's dK/dV arrive from the previous rank (which computed
        # on the block one step earlier), take this rank's part and go on to the next; after the
        # last step they arrive home.
        _wait(grad_requests)
        if incoming is not None:
            dk_part += incoming[0]
            dv_part += incoming[1]
        rows = plan.k_lens[(rank - step - 1) % world]
        incoming = (q.new_empty((k.shape[0], rows, *k.shape[2:]), dtype=acc),
                    q.new_empty((v.shape[0], rows, *v.shape[2:]), dtype=acc))  # fmt: skip
        in_flight = (dk_part, dv_part)  # referenced until the transfer is waited on
        grad_requests = _exchange(plan.group, nxt, in_flight, prev, incoming, _DKV_TAG)
    if plan.form == "ring" and world > 1:
        _wait(grad_requests)
        dk, dv = incoming
    dsinks = None
    if need_sinks:
        # dsinks[h] = -sum over b, i of P_sink * Delta, over this rank's queries.
        p_sink = torch.exp(sinks.to(acc).view(1, -1, 1) - lse.to(acc))
        dsinks = (-(p_sink * delta).sum((0, 2))).to(sinks.dtype)
    del in_flight
    return dq_acc.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsinks, *dextra


class _ContextParallelAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, extra_k, extra_v, plan):
        ctx.set_materialize_grads(False)
        merge = plan.backward == "merge"
        extra = None if extra_k is None else (extra_k, extra_v)
        out, lse, blocks = _forward(plan, q, k, v, sinks, extra, keep_blocks=merge)
        flat = [t for block in blocks for t in block] if merge else []
        ctx.save_for_backward(q, k, v, sinks, extra_k, extra_v, out, lse, *flat)
        ctx.plan = plan
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, sinks, extra_k, extra_v, out, lse, *flat = ctx.saved_tensors
        plan = ctx.plan
        blocks = list(zip(flat[0::2], flat[1::2])) if plan.backward == "merge" else None
        if dout is None:
            dout = torch.zeros_like(out)
        need_sinks = sinks is not None and ctx.needs_input_grad[3]
        extra = None if extra_k is None else (extra_k, extra_v)
        grads = _backward(plan, dout, dlse, q, k, v, out, lse, sinks, need_sinks, extra, blocks)
        return (*grads, None)


# ---- The rule between the forms ------------------------------------------------------------------


def _choose_form(plan: _Plan, heads: int, kv_heads: int, d: int, dv: int, itemsize: int) -> str:
    """'allgather' when its transfers, which nothing hides, are estimated at most
    _ALLGATHER_EXPOSED_SHARE of the busiest rank's attention time (forward and backward);
    'ring' otherwise. GQA/MQA (small Hkv) and long per-rank work favour the all-gather."""
    if plan.world == 1:
        return "ring"
    key = (tuple(map(tuple, plan.q_segs)), tuple(map(tuple, plan.k_segs)), plan.diag, plan.left,
           plan.right, heads, kv_heads, d, dv, itemsize)  # fmt: skip
    return _choose_form_cached(key)


@functools.lru_cache(maxsize=256)
def _choose_form_cached(key) -> str:
    q_segs, k_segs, diag, left, right, heads, kv_heads, d, dv, itemsize = key
    world = len(q_segs)
    k_lens = [sum(n for _, n in segs) for segs in k_segs]
    busiest = 0
    for rank in range(world):
        plan = _Plan(None, world, rank, "allgather", list(q_segs), list(k_segs), k_lens, diag,
                     left, right, None)  # fmt: skip
        entries = sum(_visible_entries(c) for c in plan.calls([(0, sum(k_lens))]))
        busiest = max(busiest, entries)
    return _form_by_estimate(k_lens, busiest, heads, kv_heads, d, dv, itemsize)


def _form_by_estimate(k_lens, busiest: int, heads, kv_heads, d, dv, itemsize) -> str:
    """The rule, from every rank's K/V rows and the busiest rank's visible score entries."""
    # K/V gathered in the forward and again in the backward, dK/dV reduce-scattered in fp32.
    moved_per_element = 2 * itemsize + max(itemsize, 4)
    moved_bytes = (len(k_lens) - 1) * max(k_lens) * kv_heads * (d + dv) * moved_per_element
    # 2 (D + Dv) flop per visible entry forward, 2.5 times that backward (fmha.bench's count).
    flops = 7 * busiest * heads * (d + dv)
    exposed = moved_bytes * _ATTENTION_FLOP_PER_LINK_BYTE / max(flops, 1.0)
    return "allgather" if exposed <= _ALLGATHER_EXPOSED_SHARE else "ring"


def _checked_inputs(q, k, v, sinks, form, bias, rel_pos, shape: str):
    """q, k, v, sinks with unit last strides, after refusing what no block call would take (before
    any transfer is posted). shape names the dims of q, k, v: "[B, L, heads, dim]" (dense) or
    "[L, heads, dim]" (packed)."""
    for name, value in (("bias", bias), ("rel_pos", rel_pos)):
        if value is not None:
            raise NotImplementedError(f"fmha.distributed: {name} is not supported across shards")
    if form not in FORMS:
        raise ValueError(
            f"fmha.distributed: form is {form!r}; accepted: 'auto', 'ring', 'allgather'"
        )
    dims = shape.count(",") + 1
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != dims:
            raise ValueError(f"fmha.distributed: {name} must be a {dims}-D tensor {shape}")
    if k.shape[:-1] != v.shape[:-1] or q.shape[:-3] != k.shape[:-3]:
        raise ValueError(
            f"fmha.distributed: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not "
            f"agree on batch, length and heads"
        )
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise TypeError(
            f"fmha.distributed: q, k, v must share dtype and device; got {q.dtype}/{q.device}, "
            f"{k.dtype}/{k.device}, {v.dtype}/{v.device}"
        )
    if q.shape[-1] != k.shape[-1] or k.shape[-2] == 0 or q.shape[-2] % k.shape[-2]:
        raise ValueError(f"fmha.distributed: q {tuple(q.shape)} and k {tuple(k.shape)}: the head "
                         f"dims must agree and q heads be a multiple of k heads")  # fmt: skip
    q, k, v = _api._tensor(q, "q"), _api._tensor(k, "k"), _api._tensor(v, "v")
    if sinks is not None:
        sinks = _api._tensor(sinks, "sinks")
        if sinks.shape != (q.shape[-2],):
            raise ValueError(f"fmha.distributed: sinks has shape {tuple(sinks.shape)}; "
                             f"expected [{q.shape[-2]}] (one per query head)")  # fmt: skip
        accepted = (torch.float32, torch.float64) if q.dtype == torch.float64 else (torch.float32,)
        if sinks.dtype not in accepted or sinks.device != q.device:
            raise TypeError(
                f"fmha.distributed: sinks has dtype {sinks.dtype} on {sinks.device}; expected "
                f"float32 on {q.device} (or float64 when q is float64)"
            )
    return q, k, v, sinks


# ---- The entry point -----------------------------------------------------------------------------


@torch.compiler.disable
def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
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
    """Attention over a sequence sharded across the ranks of group (default: the world).

    q [B, Lq_r, H, D], k [B, Lk_r, Hkv, D], v [B, Lk_r, Hkv, Dv]: this rank's shards of the
    whole q, k, v (SPEC §1) in `layout` ('contiguous' or 'zigzag', see layout_segments; shard()
    makes them). Returns this rank's out [B, Lq_r, H, Dv] (and lse [B, H, Lq_r] with return_lse),
    exactly fmha.attention of the whole sequence, sharded the same way. A collective: every rank
    of group calls it with the same options, and backpropagates through it.

    form: 'ring', 'allgather' or 'auto' (choose_form's rule, the same on every rank).
    lengths: (q lengths, k lengths) of every rank's shard; by default one small all-gather
    learns them (a host synchronisation on GPUs). scale, causal, causal_alignment (of the whole
    sequence: bottom-right aligns the last query with the last key), window, softcap, sinks,
    deterministic, backward_impl and allow_tf32 as in fmha.attention. extra_kv=(extra_k
    [B, R, Hkv, D], extra_v [B, R, Hkv, Dv]): keys every query sees (SPEC §7), the same on every
    rank. The gradients of sinks and extra_kv are this rank's parts (its queries'): sum them over
    the group as any replicated parameter's. bias and rel_pos are not supported across shards
    (NotImplementedError).
    """
    _check_layout(layout)
    q, k, v, sinks = _checked_inputs(q, k, v, sinks, form, bias, rel_pos, "[B, L, heads, dim]")
    return_lse = to_bool(return_lse, "return_lse")
    o = _api._options(scale, causal, causal_alignment, window, None, None, softcap, None, None,
                      deterministic, backward_impl, allow_tf32)  # fmt: skip

    extra = None
    if extra_kv is not None:
        extra_k, extra_v = pair(extra_kv, "extra_kv", "(extra_k, extra_v) of tensors")
        extra = (_api._tensor(extra_k, "extra_k"), _api._tensor(extra_v, "extra_v"))
        B, Hkv = q.shape[0], k.shape[2]
        want = ((B, None, Hkv, q.shape[3]), (B, None, Hkv, v.shape[3]))
        for name, t, shape in zip(("extra_k", "extra_v"), extra, want):
            if t.dim() != 4 or any(w is not None and w != n for w, n in zip(shape, t.shape)) or (
                    t.shape[1] != extra[0].shape[1]):  # fmt: skip
                raise ValueError(f"fmha.distributed: {name} has shape {tuple(t.shape)}; expected "
                                 f"[{shape[0]}, R, {shape[2]}, {shape[3]}]")  # fmt: skip
            if t.dtype != q.dtype or t.device != q.device:
                raise TypeError(f"fmha.distributed: {name} has dtype {t.dtype} on {t.device}; "
                                f"expected {q.dtype} on {q.device}")  # fmt: skip

    world, rank = _world(group)
    if lengths is None:
        q_lens, k_lens = _gather_lengths(group, q.device, [q.shape[1], k.shape[1]])
    else:
        q_lens, k_lens = ([int(n) for n in x] for x in lengths)
        if q_lens[rank] != q.shape[1] or k_lens[rank] != k.shape[1]:
            raise ValueError(f"fmha.distributed: lengths say rank {rank} holds {q_lens[rank]} "
                             f"queries and {k_lens[rank]} keys; it holds {q.shape[1]} and "
                             f"{k.shape[1]}")  # fmt: skip
    segs = []
    for name, lens in (("q", q_lens), ("k", k_lens)):
        total = sum(lens)
        rank_segs = layout_segments(total, world, layout, lens if layout == "contiguous" else None)
        for r, n in enumerate(lens):
            if sum(length for _, length in rank_segs[r]) != n:
                raise ValueError(
                    f"fmha.distributed: rank {r} holds {n} rows of {name}, not its {layout} shard "
                    f"of a sequence of {total}"
                )
        segs.append(rank_segs)
    left, right = _band(o)
    diag = sum(k_lens) - sum(q_lens) if o.bottom_right else 0
    block_options = o._replace(causal=False, bottom_right=False)
    plan = _Plan(group, world, rank, "ring", segs[0], segs[1], k_lens, diag, left, right,
                 block_options)  # fmt: skip
    if form == "auto":
        form = _choose_form(plan, q.shape[2], k.shape[2], q.shape[3], v.shape[3], q.element_size())
    plan = plan._replace(form=form, backward=_BACKWARD_MODE.get(q.device.type, "merge"))
    out, lse = _run(plan, q, k, v, sinks, extra)
    return (out, lse) if return_lse else out


def _band(o) -> tuple[int, int]:
    """The (left, right) window of options o with causal folded in (right = 0): -1 unbounded."""
    left, right = o.window_left, o.window_right
    if o.causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def _run(plan, q: Tensor, k: Tensor, v: Tensor, sinks, extra) -> tuple[Tensor, Tensor]:
    """(out, lse) of this rank's queries, differentiable when an input asks for gradients."""
    extra_k, extra_v = extra if extra is not None else (None, None)
    inputs = (q, k, v, sinks, extra_k, extra_v)
    if not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)):
        with torch.no_grad():
            out, lse, _ = _forward(plan, q, k, v, sinks, extra, keep_blocks=False)
        return out, lse
    return _ContextParallelAttention.apply(q, k, v, sinks, extra_k, extra_v, plan)


def choose_form(
    q_lengths: Sequence[int], k_lengths: Sequence[int], heads: int, kv_heads: int, head_dim: int,
    *, layout: str = "contiguous", causal: bool = False, causal_alignment: str = "top_left",
    window: Optional[tuple[int, int]] = None, value_dim: Optional[int] = None, itemsize: int = 2,
) -> str:  # fmt: skip
    """The form attention(form='auto') takes for these shards: 'allgather' when the all-gather's
    transfer (which nothing hides) is estimated at most 8% of the busiest rank's attention time
    (fwd+bwd), else 'ring'. Needs no process group."""
    world = len(q_lengths)
    q_segs = layout_segments(sum(q_lengths), world, layout,
                             q_lengths if layout == "contiguous" else None)  # fmt: skip
    k_segs = layout_segments(sum(k_lengths), world, layout,
                             k_lengths if layout == "contiguous" else None)  # fmt: skip
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    diag = sum(k_lengths) - sum(q_lengths) if causal_alignment == "bottom_right" else 0
    plan = _Plan(None, world, 0, "ring", q_segs, k_segs, list(k_lengths), diag, left, right, None)
    value_dim = head_dim if value_dim is None else value_dim
    return _choose_form(plan, heads, kv_heads, head_dim, value_dim, itemsize)


# Packed variable-length sequences: their own plan, on the machinery above (imported last, as it
# imports from this module).
from ._distributed_varlen import attention_varlen, unshard_varlen  # noqa: E402

__all__ = [
    "attention",
    "attention_varlen",
    "shard",
    "unshard",
    "shard_positions",
    "layout_segments",
    "choose_form",
    "shard_varlen",
    "unshard_varlen",
    "shard_positions_varlen",
    "shard_cu_seqlens",
    "varlen_segments",
    "LAYOUTS",
    "FORMS",
]
