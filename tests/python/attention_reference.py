"""A naive torch implementation of SPEC.md, written independently of the library: scores are
materialised, masks are boolean matrices built from the formulas, and autograd of this code gives
the reference gradients. Run it in float64 for the oracle, or in a low dtype for the "naive
same-dtype implementation" of the accuracy contract (SPEC §13)."""

from __future__ import annotations

import math

import numpy as np
import torch


def default_scale(head_dim: int) -> float:
    # The library resolves the default scale in float32 (1.0f / sqrtf(D)); the reference uses the
    # same number so that float64 comparisons are not limited by float32 rounding of the scale.
    return float(np.float32(1.0) / np.sqrt(np.float32(head_dim)))


def as_f32(x: float) -> float:
    """Scalar options (scale, softcap) cross the C++ API as float32."""
    return float(np.float32(x))


def sequence_mask(lq, lk, *, causal=False, alignment="top_left", window=None, device="cpu"):
    """[Lq, Lk] visibility of SPEC §3."""
    i = torch.arange(lq, device=device)[:, None]
    j = torch.arange(lk, device=device)[None, :]
    diag = i if alignment == "top_left" else i + (lk - lq)
    visible = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if causal:
        visible &= j <= diag
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= j >= diag - left
        if right >= 0:
            visible &= j <= diag + right
    return visible


def _axis_mask(length: int, kernel: int, dilation: int, causal: bool) -> torch.Tensor:
    """[X, X] visibility along one grid axis (SPEC §6), straight from the definition."""
    visible = torch.zeros(length, length, dtype=torch.bool)
    for x in range(length):
        g, p = x % dilation, x // dilation
        n = -(-(length - g) // dilation)
        if causal:
            ts = range(max(p - kernel + 1, 0), p + 1)
        else:
            start = min(max(p - kernel // 2, 0), n - kernel)
            ts = range(start, start + kernel)
        for t in ts:
            visible[x, g + dilation * t] = True
    return visible


def neighborhood_mask(grid, kernel_size, dilation, causal) -> torch.Tensor:
    """[N, N] visibility over the row-major flattened grid: visible on every axis."""
    visible = torch.ones(1, 1, dtype=torch.bool)
    for length, k, d, c in zip(grid, kernel_size, dilation, causal):
        axis = _axis_mask(length, k, d, c)
        n = visible.shape[0]
        visible = (visible[:, None, :, None] & axis[None, :, None, :]).reshape(n * length, n * length)
    return visible


def attention(q, k, v, *, scale=None, softcap=0.0, mask=None, bias=None, rel_pos=None, sinks=None,
              extra_kv=None):
    """SPEC §2-§10 for q [B, Lq, H, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv].
    mask: [Lq, Lk] (or broadcastable to [B, H, Lq, Lk]) boolean visibility. Returns out, lse."""
    b, lq, h, d = q.shape
    hkv = k.shape[2]
    group = h // hkv
    scale = default_scale(d) if scale is None else scale

    def scores(keys):
        keys = keys.repeat_interleave(group, dim=2)
        s = torch.einsum("bihd,bjhd->bhij", q, keys) * scale
        return softcap * torch.tanh(s / softcap) if softcap > 0 else s

    s = scores(k)
    if bias is not None:
        s = s + bias
    if rel_pos is not None:
        rel_h, rel_w = rel_pos
        wk = rel_w.shape[-1]
        hk = rel_h.shape[-1]
        s = s + rel_h.repeat_interleave(wk, dim=-1) + rel_w.repeat(1, 1, 1, hk)
    visible = torch.ones(s.shape, dtype=torch.bool, device=s.device)
    if mask is not None:
        visible = visible & mask
    s = s.masked_fill(~visible, -math.inf)
    values = v.repeat_interleave(group, dim=2)
    if extra_kv is not None:
        extra_k, extra_v = extra_kv
        s = torch.cat([s, scores(extra_k)], dim=-1)
        values = torch.cat([values, extra_v.repeat_interleave(group, dim=2)], dim=1)
        visible = torch.cat([visible, torch.ones(s.shape[:-1] + (extra_k.shape[1],),
                                                 dtype=torch.bool, device=s.device)], dim=-1)
    if sinks is not None:
        sink = sinks.to(s.dtype)[None, :, None, None].expand(b, h, lq, 1)
        s = torch.cat([s, sink], dim=-1)
        # (a column of its own: with no keys at all, visible[..., :1] would be empty)
        visible = torch.cat([visible, visible.new_ones(visible.shape[:-1] + (1,))], dim=-1)
    # A row with nothing visible has out 0 and lse -inf, with zero gradients: keep those rows
    # finite inside the computation so that autograd stays NaN-free.
    live = visible.any(dim=-1, keepdim=True)
    s_live = torch.where(live, s, torch.zeros_like(s))
    lse = torch.logsumexp(s_live, dim=-1, keepdim=True)
    p = torch.exp(s_live - lse).masked_fill(~visible, 0.0).masked_fill(~live, 0.0)
    nkeys = values.shape[1]
    out = torch.einsum("bhij,bjhd->bihd", p[..., :nkeys], values)
    lse = torch.where(live, lse, torch.full_like(lse, -math.inf)).squeeze(-1)
    return out, lse


def attention_varlen(q, k, v, cu_q, cu_k, *, bias=None, extra_kv=None, mask_fn=None, **options):
    """Packed sequences: each one is dense attention over its own keys. mask_fn(lq, lk) gives a
    sequence's mask. Returns out [total_q, H, Dv], lse [H, total_q]."""
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        lq, lk = q1 - q0, k1 - k0
        seq_bias = None if bias is None else bias.expand(len(cu_q) - 1, -1, -1, -1)[b : b + 1, :, :lq, :lk]
        seq_extra = None if extra_kv is None else tuple(t[b : b + 1] for t in extra_kv)
        out, lse = attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], bias=seq_bias,
                             extra_kv=seq_extra, mask=None if mask_fn is None else mask_fn(lq, lk),
                             **options)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs, dim=0), torch.cat(lses, dim=-1)


def merge(outs, lses):
    """SPEC §12: logaddexp of the parts' lse; parts weighted by exp(lse_part - lse); -inf parts
    contribute nothing and an all -inf row gives out 0, lse -inf."""
    stacked = torch.stack(lses)  # [N, B, H, Lq]
    live = torch.isfinite(stacked).any(dim=0)
    lse = torch.logsumexp(torch.where(live, stacked, 0.0), dim=0)
    weights = torch.exp(stacked - lse)  # [N, B, H, Lq]
    out = sum(w.permute(0, 2, 1)[..., None] * o for w, o in zip(weights, outs))
    return out, torch.where(live, lse, torch.full_like(lse, -math.inf))
