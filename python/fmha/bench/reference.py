"""Random inputs of a case, and attention computed by materialising the scores.

`materialized_attention` is both the "naive" peer (input dtype, softmax in fp32, the whole score
matrix at once) and the checking reference (fp32 on CUDA / fp64 on CPU, query rows in chunks, each
chunk recomputed in backward through activation checkpointing so memory stays O(chunk x Lk)).
"""
from __future__ import annotations

import functools
import math

import torch
from torch.utils.checkpoint import checkpoint

from . import masks
from .cases import Case

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                "fp64": torch.float64}


def grad_names(case: Case) -> list:
    """Inputs that receive gradients in the timed backward (a fixed bias does not)."""
    names = ["q", "k", "v"]
    if case.bias and case.bias_grad:
        names.append("bias")
    if case.rel_pos is not None:
        names += ["rel_h", "rel_w"]
    if case.sinks:
        names.append("sinks")
    return names


def make_inputs(case: Case, device: str, seed: int) -> dict:
    """Random inputs (never zeros) in the common layout: q [B, L, H, D] (varlen [T, H, D],
    NA [B, X1, .., H, D]); `dout` has the output's shape. Nothing requires grad here."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = TORCH_DTYPES[case.dtype]

    def randn(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)
                * scale).to(dt)

    if case.kind == "varlen":
        lead_q = lead_k = (case.total_tokens,)
    elif case.kind == "na":
        lead_q = lead_k = (case.B, *case.grid)
    else:
        lead_q, lead_k = (case.B, case.Lq), (case.B, case.Lk)
    t = {"q": randn(*lead_q, case.H, case.D), "k": randn(*lead_k, case.hkv, case.D),
         "v": randn(*lead_k, case.hkv, case.dv), "dout": randn(*lead_q, case.H, case.dv)}
    if case.bias:
        t["bias"] = randn(1 if case.bias_shared else case.B, case.H, case.Lq, case.Lk)
    if case.rel_pos is not None:
        hk, wk = case.rel_pos
        t["rel_h"] = randn(case.B, case.H, case.Lq, hk, scale=0.5)
        t["rel_w"] = randn(case.B, case.H, case.Lq, wk, scale=0.5)
    if case.sinks:
        t["sinks"] = randn(case.H, dt=torch.float32)
    if case.kind == "varlen":
        bounds = [0]
        for n in case.seqlens:
            bounds.append(bounds[-1] + n)
        t["cu_seqlens"] = torch.tensor(bounds, dtype=torch.int32, device=device)
    return t


def score_bytes(case: Case, element_size: int = 4) -> int:
    """Bytes of one materialised [B, H, Lq, Lk] score matrix (varlen: its largest sequence)."""
    if case.kind == "varlen":
        return case.H * max(case.seqlens) ** 2 * element_size
    return case.B * case.H * case.Lq * case.Lk * element_size


def _attend_rows(case: Case, scale: float, softmax_dtype, row0: int, q, k, v, bias, rel_h, rel_w,
                 sinks):
    """Attention of query rows row0.. (q [B, H, R, D]) against all keys, SPEC §2-§10."""
    s = torch.matmul(q, k.transpose(-1, -2)).to(softmax_dtype) * scale
    if case.softcap > 0:
        s = case.softcap * torch.tanh(s / case.softcap)
    if bias is not None:
        s = s + bias.to(softmax_dtype)
    if rel_h is not None:
        b, h, r, lk = s.shape
        hk, wk = case.rel_pos
        s = (s.view(b, h, r, hk, wk) + rel_h.to(softmax_dtype)[..., :, None]
             + rel_w.to(softmax_dtype)[..., None, :]).view(b, h, r, lk)
    if masks.has_mask(case):
        rows = torch.arange(row0, row0 + s.shape[2], device=s.device)[:, None]
        cols = torch.arange(s.shape[3], device=s.device)[None, :]
        vis = masks.dense_visible(case, rows, cols) if case.kind == "varlen" else \
            masks.visible(case, rows, cols)
        s = s.masked_fill(~vis, float("-inf"))
    row_max = s.amax(dim=-1, keepdim=True)
    if sinks is not None:
        sink = sinks.to(softmax_dtype).view(1, -1, 1, 1)
        row_max = torch.maximum(row_max, sink)
    # The shift only guards exp() against overflow and cancels in p; fully masked rows give 0.
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0).detach()
    e = torch.exp(s - row_max)
    z = e.sum(dim=-1, keepdim=True)
    if sinks is not None:
        z = z + torch.exp(sink - row_max)
    p = e / torch.where(z == 0, 1.0, z)
    return torch.matmul(p.to(v.dtype), v)


def _dense_attention(case: Case, t: dict, compute_dtype, softmax_dtype, row_chunk, recompute):
    """q [B, L, H, D] -> out [B, L, H, Dv] by materialising scores, in chunks of query rows."""
    q, k, v = (t[n].to(compute_dtype).transpose(1, 2) for n in ("q", "k", "v"))
    group = q.shape[1] // k.shape[1]
    if group > 1:  # GQA: query head h reads kv head h // group
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1])
    lq = q.shape[2]
    chunk = row_chunk or max(lq, 1)
    outs = []
    for r0 in range(0, lq, chunk):
        rows = slice(r0, min(r0 + chunk, lq))
        per_row = [t.get(n) for n in ("bias", "rel_h", "rel_w")]
        per_row = [x[:, :, rows] if x is not None else None for x in per_row]
        fn = functools.partial(_attend_rows, case, scale, softmax_dtype, r0)
        args = (q[:, :, rows], k, v, *per_row, t.get("sinks"))
        outs.append(checkpoint(fn, *args, use_reentrant=False) if recompute else fn(*args))
    return torch.cat(outs, dim=2).transpose(1, 2)


def materialized_attention(case: Case, t: dict, *, compute_dtype=None, softmax_dtype=None,
                           row_chunk=None, recompute=False):
    """Output of `case` on inputs `t` (common layout) computed with explicit score matrices.

    compute_dtype: dtype of the matmuls (default: the inputs'); softmax_dtype: dtype of the scores
    and softmax (default: compute_dtype); row_chunk / recompute bound the memory (reference use).
    """
    compute_dtype = compute_dtype or t["q"].dtype
    softmax_dtype = softmax_dtype or compute_dtype
    run = functools.partial(_dense_attention, case, compute_dtype=compute_dtype,
                            softmax_dtype=softmax_dtype, row_chunk=row_chunk, recompute=recompute)
    if case.kind == "varlen":
        outs, start = [], 0
        for n in case.seqlens:
            part = {name: t[name][start:start + n][None] for name in ("q", "k", "v")}
            part["sinks"] = t.get("sinks")
            outs.append(run(part)[0])
            start += n
        return torch.cat(outs, dim=0)
    if case.kind == "na":
        flat = dict(t)
        for name in ("q", "k", "v"):
            x = t[name]
            flat[name] = x.reshape(x.shape[0], -1, x.shape[-2], x.shape[-1])
        out = run(flat)
        return out.reshape(*t["q"].shape[:-1], out.shape[-1])
    return run(t)


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Norm-wise relative error ||x - ref|| / ||ref|| in float64 (NaN anywhere gives inf)."""
    x64, ref64 = x.detach().double(), ref.detach().double()
    if not torch.isfinite(x64).all():
        return float("inf")
    denom = torch.linalg.vector_norm(ref64).item()
    diff = torch.linalg.vector_norm(x64 - ref64).item()
    return diff / denom if denom > 0 else diff
