"""fmha.attention_with_kvcache: attention over a KV cache for serving (SPEC §16), named and shaped
like FlashAttention's flash_attn_with_kvcache so that engines can switch with few changes."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from . import _kv_cache_ops as _ops
from ._api import _optional_tensor, _tensor
from ._arguments import to_bool, to_float, to_int, window_bounds
from ._attention_ops import _takes_eager_path


def _seqlens(cache_seqlens, batch: int, device: torch.device) -> Tensor:
    if isinstance(cache_seqlens, Tensor):
        return cache_seqlens
    return torch.full((batch,), to_int(cache_seqlens, "cache_seqlens"), dtype=torch.int32,
                      device=device)  # fmt: skip


def attention_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_seqlens: Union[Tensor, int],
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    *,
    block_table: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    cu_seqlens_new: Optional[Tensor] = None,
    scale: Optional[float] = None,
    causal: bool = False,
    window=None,
    softcap: float = 0.0,
    sinks: Optional[Tensor] = None,
    num_splits: int = 0,
    return_lse: bool = False,
):
    """Attention of q over the first cache_seqlens[b] keys of each sequence's cache, after
    appending k / v (when given) at positions cache_seqlens[b] .. (the caches are updated in place;
    cache_seqlens is not). Masks are bottom-right: the queries are the last positions. See
    docs/api-python.md."""
    # Every scalar option is checked before the append below writes into the caches: a bad one
    # raises with the caches untouched.
    scale = None if scale is None else to_float(scale, "scale")
    softcap = to_float(softcap, "softcap")
    causal = to_bool(causal, "causal")
    window_left, window_right = window_bounds(window)
    num_splits = to_int(num_splits, "num_splits")
    return_lse = to_bool(return_lse, "return_lse")
    if max_seqlen_q is not None:
        max_seqlen_q = to_int(max_seqlen_q, "max_seqlen_q")
    q = _tensor(q, "q")
    k_cache = _tensor(k_cache, "k_cache")
    v_cache = _tensor(v_cache, "v_cache")
    batch = block_table.shape[0] if block_table is not None else k_cache.shape[0]
    seqlens = _seqlens(cache_seqlens, batch, q.device)
    if (k is None) != (v is None):
        raise ValueError("fmha: k is given but v is not (or v but not k); new tokens need both")
    if k is not None:
        k, v = _tensor(k, "k"), _tensor(v, "v")
        append = _ops.append if _takes_eager_path(q) else _ops.kvcache_append
        append(k, v, k_cache, v_cache, seqlens, block_table, cu_seqlens_new)
        if cu_seqlens_new is not None:
            seqlens = seqlens + (cu_seqlens_new[1:] - cu_seqlens_new[:-1])
        else:
            seqlens = seqlens + (k.shape[1] if k.dim() == 4 else 0)
    elif cu_seqlens_new is not None:
        raise ValueError("fmha: cu_seqlens_new is given without k and v")
    if cu_seqlens_q is not None and max_seqlen_q is None:
        # One read of the offsets (a synchronisation on CUDA); pass max_seqlen_q to avoid it.
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item()) if batch else 0
    args = (
        q, k_cache, v_cache, seqlens.to(torch.int32), block_table, cu_seqlens_q, max_seqlen_q or 0,
        scale, softcap, causal, window_left, window_right, _optional_tensor(sinks, "sinks"),
        num_splits,
    )  # fmt: skip
    if _takes_eager_path(q):
        out, lse = _ops.forward(*args, fake=False)
    else:
        out, lse = _ops.kvcache_fwd(*args)
    return (out, lse) if return_lse else out
