"""torch.library custom ops of attention over a KV cache (SPEC §16): fmha::kvcache_append writes new
tokens' K/V into the cache (in place), fmha::kvcache_fwd attends over it. Forward only. Eager calls
on plain tensors run append() / forward() directly (the op machinery costs host time per call). The split-KV
workspace comes from PyTorch's caching allocator (so it shows in torch.cuda.memory_allocated), sized
by the C++ workspace_size query."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _C, _bridge


def append(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_new) -> None:
    """The append itself: what the op runs, and what eager calls on plain tensors run directly."""
    params = _C.KvCacheAppendParams()
    params.k_new = _bridge.view(k_new, "k")
    params.v_new = _bridge.view(v_new, "v")
    params.cu_seqlens_new = _bridge.view(cu_seqlens_new, "cu_seqlens_new")
    params.k_cache = _bridge.view(k_cache, "k_cache")
    params.v_cache = _bridge.view(v_cache, "v_cache")
    params.block_table = _bridge.view(block_table, "block_table")
    params.cache_seqlens = _bridge.view(cache_seqlens, "cache_seqlens")
    _bridge.run(params, k_cache.device)


@torch.library.custom_op("fmha::kvcache_append", mutates_args=("k_cache", "v_cache"))
def kvcache_append(
    k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
    block_table: Optional[Tensor], cu_seqlens_new: Optional[Tensor],
) -> None:  # fmt: skip
    append(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_new)


@kvcache_append.register_fake
def _(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_new):
    return None


def _lse_shape(q: Tensor, packed: bool) -> tuple:
    if packed:  # [H, total_q]
        return (q.shape[1], q.shape[0]) if q.dim() == 3 else (0, 0)
    return (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (0, 0, 0)


def forward(
    q, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_q, max_seqlen_q, scale, softcap,
    causal, window_left, window_right, sinks, num_splits, *, fake: bool,
):  # fmt: skip
    packed = cu_seqlens_q is not None
    out_shape = (*q.shape[:-1], v_cache.shape[-1])
    lse_shape = _lse_shape(q, packed)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=lse_dtype, device=q.device)
    if fake:
        return out, lse
    options = _C.AttentionOptions()
    options.scale = scale
    options.softcap = softcap
    options.causal = causal
    options.causal_alignment = _C.CausalAlignment.bottom_right
    options.window_left = window_left
    options.window_right = window_right
    options.sinks = _bridge.view(sinks, "sinks")
    params = _C.KvCacheForwardParams()
    params.q = _bridge.view(q, "q")
    params.cu_seqlens_q = _bridge.view(cu_seqlens_q, "cu_seqlens_q")
    params.max_seqlen_q = max_seqlen_q
    params.k_cache = _bridge.view(k_cache, "k_cache")
    params.v_cache = _bridge.view(v_cache, "v_cache")
    params.block_table = _bridge.view(block_table, "block_table")
    params.cache_seqlens = _bridge.view(cache_seqlens, "cache_seqlens")
    params.out = _bridge.view(out, "out")
    params.lse = _bridge.view(lse, "lse")
    params.options = options
    params.num_splits = num_splits
    workspace, workspace_bytes = None, 0
    if q.device.type == "cuda":  # the CPU backend needs none
        status, workspace_bytes = _C.workspace_size(params)
        _bridge.raise_for_status(status)
    if workspace_bytes > 0:
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device)
        params.workspace = workspace.data_ptr()
        params.workspace_bytes = workspace_bytes
    _bridge.run(params, q.device)
    del workspace  # back to the caching allocator, stream-ordered like any tensor freed here
    return out, lse


@torch.library.custom_op("fmha::kvcache_fwd", mutates_args=())
def kvcache_fwd(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
    block_table: Optional[Tensor], cu_seqlens_q: Optional[Tensor], max_seqlen_q: int,
    scale: Optional[float], softcap: float, causal: bool, window_left: int, window_right: int,
    sinks: Optional[Tensor], num_splits: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    return forward(q, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_q, max_seqlen_q,
                    scale, softcap, causal, window_left, window_right, sinks, num_splits,
                    fake=False)  # fmt: skip


@kvcache_fwd.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_q, max_seqlen_q, scale, softcap,
      causal, window_left, window_right, sinks, num_splits):  # fmt: skip
    return forward(q, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_q, max_seqlen_q,
                    scale, softcap, causal, window_left, window_right, sinks, num_splits,
                    fake=True)  # fmt: skip
