"""The public functions of fmha (SPEC §15). They normalise Python-level arguments (tuples, strings,
ints for every axis) by the rules of _arguments, which fmha.jax shares, make the last dimension of
each input contiguous when it is not, and call the custom ops of _attention_ops / _merge_ops, which
carry autograd and torch.compile support (attention calls on plain tensors through
_attention_ops.call_options: the ops' eager path)."""

from __future__ import annotations

from typing import Optional, Sequence, Union

from torch import Tensor

from . import _attention_ops as _ops
from ._arguments import merge_parts, per_axis, scalar_options, split_pairs, to_bool, to_int
from ._merge_ops import merge_fwd


def _tensor(t, name: str, *, broadcast_last: bool = False) -> Tensor:
    """t with unit stride on its last dimension (copied once when it has another stride), which is
    what the C++ layer reads. Every other stride, including 0, goes through untouched.
    broadcast_last: bias and rel-pos may also broadcast along their last dimension (stride 0)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"fmha: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] == 1:
        return t
    if broadcast_last and t.stride(-1) == 0:
        return t
    return t.contiguous()


def _optional_tensor(t, name: str, **kwargs) -> Optional[Tensor]:
    return None if t is None else _tensor(t, name, **kwargs)


_NO_TENSORS = (None,) * 6  # bias, rel_h, rel_w, sinks, extra_k, extra_v: none given


def _options(
    scale, causal, causal_alignment, window, bias, rel_pos, softcap, sinks, extra_kv,
    deterministic, backward_impl, allow_tf32,
) -> _ops.Options:  # fmt: skip
    scalars = scalar_options(scale, causal, causal_alignment, window, softcap, deterministic)
    _ops.check_backward_impl(backward_impl)
    if bias is None and rel_pos is None and sinks is None and extra_kv is None:
        tensors = _NO_TENSORS  # the common call: nothing to look at
    else:
        rel_h, rel_w, extra_k, extra_v = split_pairs(rel_pos, extra_kv, "tensors")
        tensors = (
            _optional_tensor(bias, "bias", broadcast_last=True),
            _optional_tensor(rel_h, "rel_h", broadcast_last=True),
            _optional_tensor(rel_w, "rel_w", broadcast_last=True),
            _optional_tensor(sinks, "sinks"),
            _optional_tensor(extra_k, "extra_k"),
            _optional_tensor(extra_v, "extra_v"),
        )
    # Positional, in the order of Options' fields: the tensors, then the scalars.
    return _ops.Options(*tensors, *scalars, backward_impl, to_bool(allow_tf32, "allow_tf32"))


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: Optional[tuple[int, int]] = None,
    bias: Optional[Tensor] = None,
    rel_pos: Optional[tuple[Tensor, Tensor]] = None,
    softcap: float = 0.0,
    sinks: Optional[Tensor] = None,
    extra_kv: Optional[tuple[Tensor, Tensor]] = None,
    return_lse: bool = False,
    deterministic: bool = False,
    backward_impl: str = "auto",
    allow_tf32: bool = False,
) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """Exact attention: softmax(scale * q k^T [softcap] + bias + rel-pos, masked) v.

    q [B, Lq, H, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv] (H % Hkv == 0: GQA/MQA without copies).
    Returns out [B, Lq, H, Dv], and lse [B, H, Lq] (fp32) when return_lse=True; lse is
    differentiable too.

    scale: default 1/sqrt(D). causal / causal_alignment ('top_left' or 'bottom_right') and
    window=(left, right) (-1 unbounded) mask keys; both may be given. bias: any shape that
    broadcasts to [B, H, Lq, Lk] (e.g. [H, Lq, Lk] or [1, H, 1, Lk]), never materialised; its
    gradient comes back in its own shape. rel_pos=(rel_h [B, H, Lq, Hk], rel_w [B, H, Lq, Wk])
    with Lk = Hk * Wk (broadcastable likewise). softcap > 0: s = softcap * tanh(s / softcap).
    sinks [H] fp32: one extra logit per head. extra_kv=(extra_k [B, R, Hkv, D],
    extra_v [B, R, Hkv, Dv]): keys every query sees, unmasked, unbiased. deterministic: bitwise
    reproducible results. backward_impl: how the CUDA backward runs, 'fused' (one pass per K/V
    block, dQ accumulated in fp32), 'split' (a dQ kernel and a dK/dV kernel) or 'auto' (chosen per
    problem by a measured rule: on Hopper the fused kernel wherever it applies);
    deterministic=True runs split, or on Hopper the fused kernel with its dQ adds in a fixed order;
    the fast CPU backend has the same two structures; the forward and the float64 reference ignore
    it. allow_tf32: fp32 inputs may use TF32 tensor cores
    (looser accuracy).
    """
    return_lse = to_bool(return_lse, "return_lse")
    o = _options(scale, causal, causal_alignment, window, bias, rel_pos, softcap, sinks,
                 extra_kv, deterministic, backward_impl, allow_tf32)  # fmt: skip
    out, lse = _ops.call_options(
        _ops.attention_fwd, _tensor(q, "q"), _tensor(k, "k"), _tensor(v, "v"), (), o
    )
    return (out, lse) if return_lse else out


def attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: Optional[tuple[int, int]] = None,
    bias: Optional[Tensor] = None,
    rel_pos: Optional[tuple[Tensor, Tensor]] = None,
    softcap: float = 0.0,
    sinks: Optional[Tensor] = None,
    extra_kv: Optional[tuple[Tensor, Tensor]] = None,
    return_lse: bool = False,
    deterministic: bool = False,
    backward_impl: str = "auto",
    allow_tf32: bool = False,
    check_cu_seqlens: bool = False,
) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """Attention over a packed batch of variable-length sequences.

    q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]; cu_seqlens_q / cu_seqlens_k
    [B + 1] int32 on q's device, ascending from 0: sequence b owns rows cu_seqlens[b] ..
    cu_seqlens[b + 1] - 1 and sees only its own keys; masks use positions inside the sequence.
    max_seqlen_q / max_seqlen_k are Python ints (the longest sequence). CPU offsets are always
    checked (ascending from 0, last = total rows, no sequence longer than max_seqlen). CUDA ones
    are not read on the host: the kernels clamp every offset to the tensors' extents, so invalid
    ones give wrong results but never touch memory outside the tensors. check_cu_seqlens=True
    copies them to the host and refuses invalid ones with the CPU check's ValueError, at the cost
    of a device synchronisation in the forward and in the backward (not allowed while a CUDA graph
    is being captured). Returns out
    [total_q, H, Dv] and, with return_lse, lse [H, total_q]. Options as in attention(); bias
    broadcasts to [B, H, max_seqlen_q, max_seqlen_k]; extra_kv are per sequence [B, R, Hkv, *];
    rel_pos is refused (a packed batch has no common key grid).
    """
    return_lse = to_bool(return_lse, "return_lse")
    o = _options(scale, causal, causal_alignment, window, bias, rel_pos, softcap, sinks,
                 extra_kv, deterministic, backward_impl, allow_tf32)  # fmt: skip
    out, lse = _ops.call_options(
        _ops.attention_varlen_fwd, _tensor(q, "q"), _tensor(k, "k"), _tensor(v, "v"), (
            _tensor(cu_seqlens_q, "cu_seqlens_q"), _tensor(cu_seqlens_k, "cu_seqlens_k"),
            to_int(max_seqlen_q, "max_seqlen_q"), to_int(max_seqlen_k, "max_seqlen_k"),
            to_bool(check_cu_seqlens, "check_cu_seqlens"),
        ), o,
    )  # fmt: skip
    return (out, lse) if return_lse else out


def _neighborhood(num_dims, q, k, v, kernel_size, dilation, is_causal, scale, extra_kv, sinks,
                  return_lse, backward_impl):  # fmt: skip
    return_lse = to_bool(return_lse, "return_lse")
    layout_args = (
        list(per_axis(kernel_size, num_dims, "kernel_size", to_int)),
        list(per_axis(dilation, num_dims, "dilation", to_int)),
        list(per_axis(is_causal, num_dims, "is_causal", to_bool)),
    )
    o = _options(scale, False, "top_left", None, None, None, 0.0, sinks, extra_kv, False,
                 backward_impl, False)  # fmt: skip
    out, lse = _ops.call_options(
        _ops.neighborhood_fwd, _tensor(q, "q"), _tensor(k, "k"), _tensor(v, "v"), layout_args, o
    )
    return (out, lse) if return_lse else out


_NA_DOC = """Neighborhood attention over a {n}-D token grid (SPEC §6).

    q [B, {grid}, H, D], k [B, {grid}, Hkv, D], v [B, {grid}, Hkv, Dv]. Each query sees the
    kernel_size keys around it on every axis (the window shifts inward at borders), spaced by
    dilation; is_causal=True sees only the kernel_size keys up to and including itself on that
    axis. kernel_size / dilation / is_causal: one value for every axis or a tuple of {n}.
    scale, extra_kv=(extra_k [B, R, Hkv, D], extra_v [B, R, Hkv, Dv]), sinks [H] and
    backward_impl ('auto' | 'fused' | 'split') as in attention(). Returns out [B, {grid}, H, Dv]
    and, with return_lse, lse [B, H, {grid}].
    """


def na1d(
    q: Tensor, k: Tensor, v: Tensor,
    kernel_size: Union[int, Sequence[int]],
    dilation: Union[int, Sequence[int]] = 1,
    is_causal: Union[bool, Sequence[bool]] = False,
    *,
    scale: Optional[float] = None,
    extra_kv: Optional[tuple[Tensor, Tensor]] = None,
    sinks: Optional[Tensor] = None,
    return_lse: bool = False,
    backward_impl: str = "auto",
) -> Union[Tensor, tuple[Tensor, Tensor]]:  # fmt: skip
    return _neighborhood(1, q, k, v, kernel_size, dilation, is_causal, scale, extra_kv, sinks,
                         return_lse, backward_impl)  # fmt: skip


def na2d(
    q: Tensor, k: Tensor, v: Tensor,
    kernel_size: Union[int, Sequence[int]],
    dilation: Union[int, Sequence[int]] = 1,
    is_causal: Union[bool, Sequence[bool]] = False,
    *,
    scale: Optional[float] = None,
    extra_kv: Optional[tuple[Tensor, Tensor]] = None,
    sinks: Optional[Tensor] = None,
    return_lse: bool = False,
    backward_impl: str = "auto",
) -> Union[Tensor, tuple[Tensor, Tensor]]:  # fmt: skip
    return _neighborhood(2, q, k, v, kernel_size, dilation, is_causal, scale, extra_kv, sinks,
                         return_lse, backward_impl)  # fmt: skip


def na3d(
    q: Tensor, k: Tensor, v: Tensor,
    kernel_size: Union[int, Sequence[int]],
    dilation: Union[int, Sequence[int]] = 1,
    is_causal: Union[bool, Sequence[bool]] = False,
    *,
    scale: Optional[float] = None,
    extra_kv: Optional[tuple[Tensor, Tensor]] = None,
    sinks: Optional[Tensor] = None,
    return_lse: bool = False,
    backward_impl: str = "auto",
) -> Union[Tensor, tuple[Tensor, Tensor]]:  # fmt: skip
    return _neighborhood(3, q, k, v, kernel_size, dilation, is_causal, scale, extra_kv, sinks,
                         return_lse, backward_impl)  # fmt: skip


na1d.__doc__ = _NA_DOC.format(n=1, grid="X")
na2d.__doc__ = _NA_DOC.format(n=2, grid="X1, X2")
na3d.__doc__ = _NA_DOC.format(n=3, grid="X1, X2, X3")


def merge_attentions(outs: Sequence[Tensor], lses: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Merges attentions of the same queries over disjoint key sets (SPEC §12).

    outs: parts [B, Lq, H, Dv] (all one dtype), lses: their [B, H, Lq] fp32 log-sum-exps, e.g.
    from attention(..., return_lse=True). Returns (out, lse) of attention over the union of the
    keys; differentiable in every part. Apply sinks in exactly one part.
    """
    merge_parts(outs, lses, "tensors")
    out_parts = [_tensor(t, f"outs[{i}]") for i, t in enumerate(outs)]
    lse_parts = [_tensor(t, f"lses[{i}]") for i, t in enumerate(lses)]
    return merge_fwd(out_parts, lse_parts)
