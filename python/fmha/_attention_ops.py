"""torch.library custom ops for dense, varlen and neighborhood attention, forward and backward.

Each layout has a forward op returning (out, lse) and a backward op returning every gradient, both
opaque to torch.compile (a fake kernel describes their outputs) and joined by register_autograd.
The ops take tensors exactly as the C++ layer does (SPEC §1), except that `bias` may have any shape
that broadcasts to [B, H, Lq, Lk] and rel_h / rel_w any shape that broadcasts to [B, H, Lq, *]:
the ops view them as 4-D with leading size-1 dimensions, which the C++ layer broadcasts, so
nothing is materialised and their gradients come back in their own shapes.

Argument order of every op:  q, k, v, <layout arguments>, <options>            (forward)
                             dout, dlse, q, k, v, out, lse, <layout>, needs, <options>  (backward)
where <options> are the fields of `Options` in order and `needs` says which optional gradients
(bias, rel_h, rel_w, sinks, extra_k, extra_v) to compute; gradients not computed come back as
empty tensors, since a custom op cannot return None.

Eager calls on plain tensors take a shorter way to the same functions (`call`): an
autograd.Function per layout whose forward and backward run this module's forward() and backward()
directly, or forward() alone when no gradient can flow. torch's custom-op machinery (the
dispatcher, the op's autograd wrapper and its Python layers) cost a forward call about 70 us of
host time on an H200's machine (2026-11-27, bench/host_overhead.py), as much as the C++ call and
its kernels' launch at short sequences. Under
torch.compile and torch.jit.trace, under dispatch modes or functorch transforms and on tensor
subclasses (fake tensors among them) the ops run as before.
"""

from __future__ import annotations

import atexit
import math
from typing import NamedTuple, Optional

import torch
import torch.autograd.forward_ad as _forward_ad
from torch import Tensor

from . import _C, _backend, _bridge
from ._arguments import BACKWARD_IMPLS, choice
from ._cpu_threads import use_torch_openmp

# The fast CPU backend's workers run on PyTorch's OpenMP team (_cpu_threads.py).
use_torch_openmp()


class Options(NamedTuple):
    bias: Optional[Tensor]
    rel_h: Optional[Tensor]
    rel_w: Optional[Tensor]
    sinks: Optional[Tensor]
    extra_k: Optional[Tensor]
    extra_v: Optional[Tensor]
    scale: Optional[float]
    softcap: float
    causal: bool
    bottom_right: bool
    window_left: int
    window_right: int
    deterministic: bool
    backward_impl: str  # 'auto', 'fused' or 'split': read by the backward only
    allow_tf32: bool


_BACKWARD_IMPL_ENUMS = {name: getattr(_C.BackwardImpl, name) for name in BACKWARD_IMPLS}


def _has_optional_tensors(o: "Options") -> bool:
    """Whether a call has any of bias, rel_h, rel_w, sinks, extra_k, extra_v."""
    return not (o.bias is None and o.rel_h is None and o.rel_w is None and o.sinks is None
                and o.extra_k is None and o.extra_v is None)


def check_backward_impl(name) -> None:
    """The public functions check it first; the ops check it again for direct torch.ops calls."""
    choice(name, "backward_impl", BACKWARD_IMPLS)


_NUM_OPTIONAL_GRADS = 6  # bias, rel_h, rel_w, sinks, extra_k, extra_v: the first fields of Options


# ---- Shapes of each layout ---------------------------------------------------------------------
# All shape helpers are best effort and never raise: when an input has the wrong rank they return
# a placeholder, and the C++ check refuses that input with its own message before anything is used.


class _Dense:
    check_reads_inputs = False
    forward_params = _C.AttentionForwardParams
    backward_params = _C.AttentionBackwardParams

    @staticmethod
    def lse_shape(q: Tensor, layout_args) -> tuple:  # [B, H, Lq]
        shape = q.shape  # a new torch.Size each time it is read
        return (shape[0], shape[2], shape[1]) if len(shape) == 4 else (0,)

    @staticmethod
    def score_rows(q: Tensor) -> Optional[tuple]:  # [B, H, Lq] of the scores rel-pos adds to
        return (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else None

    @staticmethod
    def fill(params, layout_args, planned: bool) -> None:
        pass


class _Varlen:
    # The C++ check reads CPU cu_seqlens values (ascending, within max_seqlen), so it cannot run
    # on fake tensors: the real call checks them (CUDA ones only with check_cu_seqlens; otherwise
    # the kernels clamp what they read to the tensors).
    check_reads_inputs = True
    forward_params = _C.VarlenForwardParams
    backward_params = _C.VarlenBackwardParams

    @staticmethod
    def lse_shape(q: Tensor, layout_args) -> tuple:  # [H, total_q]
        return (q.shape[1], q.shape[0]) if q.dim() == 3 else (0,)

    @staticmethod
    def score_rows(q: Tensor) -> Optional[tuple]:
        return None  # rel-pos is refused for packed batches

    @staticmethod
    def fill(params, layout_args, planned: bool) -> None:
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_cu_seqlens = layout_args
        params.cu_seqlens_q = _bridge.view(cu_seqlens_q, "cu_seqlens_q", planned=planned)
        params.cu_seqlens_k = _bridge.view(cu_seqlens_k, "cu_seqlens_k", planned=planned)
        params.max_seqlen_q = max_seqlen_q
        params.max_seqlen_k = max_seqlen_k
        params.check_cu_seqlens = check_cu_seqlens


class _Neighborhood:
    check_reads_inputs = False
    forward_params = _C.NeighborhoodForwardParams
    backward_params = _C.NeighborhoodBackwardParams

    @staticmethod
    def lse_shape(q: Tensor, layout_args) -> tuple:  # [B, H, X1, (X2, (X3))]
        return (q.shape[0], q.shape[-2], *q.shape[1:-2]) if q.dim() >= 3 else (0,)

    @staticmethod
    def score_rows(q: Tensor) -> Optional[tuple]:  # rows over the flattened grid
        return (q.shape[0], q.shape[-2], math.prod(q.shape[1:-2])) if q.dim() >= 3 else None

    @staticmethod
    def fill(params, layout_args, planned: bool) -> None:
        kernel_size, dilation, is_causal = layout_args
        na = _C.NeighborhoodOptions()
        na.num_dims = len(kernel_size)
        # Axes past num_dims keep the neutral values; a length mismatch is reported by C++ through
        # num_dims against the rank of q.
        na.kernel_size = (list(kernel_size) + [1, 1, 1])[:3]
        na.dilation = (list(dilation) + [1, 1, 1])[:3]
        na.causal = (list(is_causal) + [False, False, False])[:3]
        params.neighborhood = na


# ---- Conversions ---------------------------------------------------------------------------------


def _as_4d(t: Optional[Tensor]) -> Optional[Tensor]:
    """bias / rel-pos with leading size-1 dimensions up to rank 4 (a view, as torch broadcasting
    aligns shapes on the right): the C++ layer broadcasts every dimension of size 1 itself and
    gives their gradients the input's own shape, summed over those dimensions."""
    if t is None or t.dim() >= 4:
        return t
    return t[(None,) * (4 - t.dim())]


def _rel_pos_for_backward(rel: Optional[Tensor], rows: Optional[tuple], needed: bool):
    """(rel view for C++, gradient buffer for C++, gradient to return) of one rel-pos input.
    A rel-pos broadcast over B, H or Lq gets its gradient computed dense at the full
    [B, H, Lq, X] shape (small: X is Hk or Wk) and summed here, which every backend supports;
    the C++ layer then reads the input as a stride-0 expansion of the same shape."""
    if rel is None or not needed:
        return _as_4d(rel), None, None
    rel4 = _as_4d(rel)
    if rows is None or tuple(rel4.shape[:3]) == tuple(rows):
        grad = rel.new_empty(rel.shape)
        return rel4, _as_4d(grad), grad
    full = (*rows, rel4.shape[-1])
    grad_full = rel.new_empty(full)
    return rel4.expand(full), grad_full, grad_full


def _dense(t: Optional[Tensor]) -> Optional[Tensor]:
    """A gradient flowing in from autograd may be a stride-0 expansion (e.g. from .sum()); the C++
    layer needs unit stride on the last dimension, so such a tensor is materialised once."""
    if t is None or t.dim() == 0:
        return t
    stride = t.stride()
    if stride[-1] == 1 and 0 not in stride:
        return t
    return t.contiguous()


def _broadcast_dims_are_size_one(t: Tensor) -> bool:
    """True unless t has stride 0 on a dimension of size > 1 (an expand()ed tensor)."""
    return all(st != 0 or sz == 1 for sz, st in zip(t.shape, t.stride()))


# AttentionOptions of calls without optional tensors, by their scalar fields (already normalised
# to bool / int / float by the public functions or the op's schema), the CPU backend and thread
# count: a parameter struct copies the options it is given, so one object serves every such call.
_SCALAR_OPTIONS: dict = {}
_SCALAR_OPTIONS_LIMIT = 64
# Emptied before the interpreter unloads the extension, which would otherwise report the cached
# objects as leaked.
atexit.register(_SCALAR_OPTIONS.clear)


def _c_options(o: Options, bias, rel_h, rel_w, planned: bool) -> _C.AttentionOptions:
    if bias is None and rel_h is None and rel_w is None and o.sinks is None \
            and o.extra_k is None and o.extra_v is None:
        key = (*o[6:13], o.allow_tf32, _backend.get_cpu_backend(), torch.get_num_threads())
        c = _SCALAR_OPTIONS.get(key)
        if c is None:
            c = _scalar_options(o)
            if len(_SCALAR_OPTIONS) >= _SCALAR_OPTIONS_LIMIT:
                _SCALAR_OPTIONS.clear()
            _SCALAR_OPTIONS[key] = c
        return c
    c = _scalar_options(o)
    # The tensors left out stay the default, empty views ('not given').
    for name, t, broadcast in (
        ("bias", bias, True),
        ("rel_h", rel_h, True),
        ("rel_w", rel_w, True),
        ("sinks", o.sinks, False),
        ("extra_k", o.extra_k, False),
        ("extra_v", o.extra_v, False),
    ):
        if t is not None:
            setattr(c, name, _bridge.view(t, name, planned=planned, broadcast=broadcast))
    return c


def _scalar_options(o: Options) -> _C.AttentionOptions:
    c = _C.AttentionOptions()
    c.scale = o.scale
    c.softcap = o.softcap
    c.causal = o.causal
    if o.bottom_right:
        c.causal_alignment = _C.CausalAlignment.bottom_right
    c.window_left = o.window_left
    c.window_right = o.window_right
    c.deterministic = o.deterministic
    c.allow_tf32 = o.allow_tf32
    c.cpu_backend = getattr(_C.CpuBackend, _backend.get_cpu_backend())
    c.cpu_threads = torch.get_num_threads()  # the fast CPU backend uses torch's intra-op threads
    return c


def _lse_dtype(q: Tensor) -> torch.dtype:
    # fp32 by contract; fp64 problems get fp64 lse so that finite differences through lse work.
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _out_shape(q: Tensor, v: Tensor) -> tuple:
    return (*q.shape[:-1], v.shape[-1]) if q.dim() >= 1 and v.dim() >= 1 else (0,)


# ---- Forward -------------------------------------------------------------------------------------


def forward(layout, q, k, v, layout_args, o: Options, *, fake: bool, views: Optional[list] = None):
    """Checks, allocates (out, lse) and runs one forward call. With fake=True (torch.compile's
    tracing) only the metadata exists: the check still runs when the shapes are static. A real call
    is checked by run() itself, before any memory is touched: the same check, one crossing into
    C++ instead of two (the outputs are allocated first, so a refused call frees them again).
    `views`, when given, receives the views of q, k, v, out and lse, for a backward of the same
    tensors to reuse (backward's `views`)."""
    check_backward_impl(o.backward_impl)
    lse_shape = layout.lse_shape(q, layout_args)
    lse_dtype = _lse_dtype(q)
    if fake:
        out_shape = _out_shape(q, v)
        layout_tensors = [a for a in layout_args if isinstance(a, Tensor)]
        optional = ("bias", "rel_h", "rel_w", "sinks", "extra_k", "extra_v")
        _bridge.check_devices(
            ("q", q), ("k", k), ("v", v), *zip(("cu_seqlens_q", "cu_seqlens_k"), layout_tensors),
            *zip(optional, o[:_NUM_OPTIONAL_GRADS]),
        )  # fmt: skip
        if not layout.check_reads_inputs and _bridge.is_static(
            q, k, v, *layout_tensors, *o[:_NUM_OPTIONAL_GRADS]
        ):
            params, _ = _params(layout, q, k, v, layout_args, o, planned=True)
            params.out = _bridge.planned_contiguous(out_shape, q.dtype, q.device, "out")
            params.lse = _bridge.planned_contiguous(lse_shape, lse_dtype, q.device, "lse")
            _bridge.check(params)  # refuse before allocating anything
        return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=lse_dtype)
    q_shape, v_shape = q.shape, v.shape
    if len(q_shape) == len(v_shape) >= 1 and q_shape[-1] == v_shape[-1]:  # Dv == D: q's shape
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    else:
        out = q.new_empty(_out_shape(q, v))
    # The sizes as separate arguments: torch parses a tuple of sizes 0.3 us slower.
    lse = q.new_empty(*lse_shape, dtype=lse_dtype)
    params, input_views = _params(layout, q, k, v, layout_args, o, planned=False)
    params.out = out_view = _bridge.view(out, "out")
    params.lse = lse_view = _bridge.view(lse, "lse")
    _bridge.run_shaped(params, q.device)
    if views is not None:
        views += (*input_views, out_view, lse_view)
    return out, lse


def _params(layout, q, k, v, layout_args, o: Options, *, planned: bool):
    """A forward call's parameters without its outputs, and the views of q, k and v in them (equal
    to params.q and the others, which are copies: reading those back would make a wrapper each)."""
    params = layout.forward_params()
    params.q = q_view = _bridge.view(q, "q", planned=planned)
    params.k = k_view = _bridge.view(k, "k", planned=planned)
    params.v = v_view = _bridge.view(v, "v", planned=planned)
    layout.fill(params, layout_args, planned)
    params.options = _c_options(
        o, _as_4d(o.bias), _as_4d(o.rel_h), _as_4d(o.rel_w), planned=planned
    )
    return params, (q_view, k_view, v_view)


# ---- Backward ------------------------------------------------------------------------------------


def backward(
    layout, dout, dlse, q, k, v, out, lse, layout_args, needs, o: Options, *, fake: bool,
    unasked=None, views=None,
):  # fmt: skip
    """Allocates and computes (dq, dk, dv, dbias, drel_h, drel_w, dsinks, dextra_k, dextra_v).
    dbias has the bias's own shape: the C++ layer sums over its broadcast dimensions. A gradient
    not asked for is unasked(): by default an empty tensor of its own (the ops' outputs are
    tensors and may not alias); the eager path, which returns None for it, passes a callable
    returning None. Given an `unasked`, a call without optional tensors calls it once for all six,
    so its result must be one that may be shared. `views`: the forward's views of q, k, v, out and
    lse (forward's `views`), valid while the tensors they describe are the ones passed here,
    unchanged (autograd's saved tensors: kept alive, and checked against in-place changes when
    unpacked); made here when not given."""
    check_backward_impl(o.backward_impl)
    optional = _has_optional_tensors(o)
    if optional:
        need_bias, need_rel_h, need_rel_w, need_sinks, need_extra_k, need_extra_v = (
            bool(n) and t is not None for n, t in zip(needs, o[:_NUM_OPTIONAL_GRADS])
        )
    else:  # the common call: no optional input, so no optional gradient
        need_bias = need_rel_h = need_rel_w = need_sinks = need_extra_k = need_extra_v = False

    def empty():
        return q.new_empty(0) if unasked is None else unasked()

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if optional or unasked is None:
        dbias = o.bias.new_empty(o.bias.shape) if need_bias else empty()
        dsinks = torch.empty_like(o.sinks) if need_sinks else empty()
        dextra_k = torch.empty_like(o.extra_k) if need_extra_k else empty()
        dextra_v = torch.empty_like(o.extra_v) if need_extra_v else empty()
        # rel-pos gradients are dense, even for an expand()ed rel_h: it has a distinct gradient
        # per element.
        drel_h = o.rel_h.new_empty(o.rel_h.shape) if need_rel_h else empty()
        drel_w = o.rel_w.new_empty(o.rel_w.shape) if need_rel_w else empty()
    else:  # none asked, and one unasked() result serves all six
        dbias = drel_h = drel_w = dsinks = dextra_k = dextra_v = unasked()
    if fake:
        return dq, dk, dv, dbias, drel_h, drel_w, dsinks, dextra_k, dextra_v

    bias = o.bias
    if need_bias and not _broadcast_dims_are_size_one(bias):
        # An expand()ed bias has a distinct gradient per element, so dbias is dense here and the
        # C++ layer needs a bias with the same (dense) strides; same values, one copy.
        bias = bias.contiguous()
    params = layout.backward_params()
    if views is None:
        views = (_bridge.view(q, "q"), _bridge.view(k, "k"), _bridge.view(v, "v"),
                 _bridge.view(out, "out"), _bridge.view(lse, "lse"))  # fmt: skip
    params.q, params.k, params.v, params.out, params.lse = views
    layout.fill(params, layout_args, False)
    # Views hold raw addresses: every tensor they describe must stay referenced until run().
    dout, dlse = _dense(dout), _dense(dlse)
    params.dout = _bridge.view(dout, "dout")
    if dlse is not None:
        params.dlse = _bridge.view(dlse, "dlse")
    rel_h = rel_w = None
    if o.rel_h is not None or o.rel_w is not None:
        rows = layout.score_rows(q)
        rel_h, drel_h_buffer, drel_h_full = _rel_pos_for_backward(o.rel_h, rows, need_rel_h)
        rel_w, drel_w_buffer, drel_w_full = _rel_pos_for_backward(o.rel_w, rows, need_rel_w)
    params.options = _c_options(o, _as_4d(bias), rel_h, rel_w, planned=False)
    params.backward_impl = _BACKWARD_IMPL_ENUMS[o.backward_impl]
    grads = _C.AttentionGradients()
    grads.dq = _bridge.view(dq, "dq")
    grads.dk = _bridge.view(dk, "dk")
    grads.dv = _bridge.view(dv, "dv")
    # Gradients not asked for keep the default, empty views ('not given').
    if need_bias:
        grads.dbias = _bridge.view(_as_4d(dbias), "dbias", broadcast=True)
    if need_rel_h:
        grads.drel_h = _bridge.view(drel_h_buffer, "drel_h")
    if need_rel_w:
        grads.drel_w = _bridge.view(drel_w_buffer, "drel_w")
    if need_sinks:
        grads.dsinks = _bridge.view(dsinks, "dsinks")
    if need_extra_k:
        grads.dextra_k = _bridge.view(dextra_k, "dextra_k")
    if need_extra_v:
        grads.dextra_v = _bridge.view(dextra_v, "dextra_v")
    params.grads = grads
    _bridge.run_shaped(params, q.device)
    if need_rel_h:
        drel_h = drel_h_full.sum_to_size(o.rel_h.shape)
    if need_rel_w:
        drel_w = drel_w_full.sum_to_size(o.rel_w.shape)
    return dq, dk, dv, dbias, drel_h, drel_w, dsinks, dextra_k, dextra_v


# ---- Autograd glue shared by the three layouts ---------------------------------------------------


def _setup_context(ctx, inputs, output) -> None:
    # Tensors go through save_for_backward (None where an input is not a tensor); the scalars and
    # lists stay on ctx.
    tensors = [x if isinstance(x, Tensor) else None for x in inputs]
    ctx.save_for_backward(*tensors, *output)
    ctx.non_tensors = [x if t is None else None for t, x in zip(tensors, inputs)]


def _make_backward(backward_op, num_layout_args: int):
    """The backward of a forward op: its inputs from ctx, run_backward's gradients, and None for
    every input without one. backward_op: the layout's backward op, or a callable of the same
    arguments (the eager path's)."""
    first_option = 3 + num_layout_args

    def _backward(ctx, dout, dlse):
        *saved, out, lse = ctx.saved_tensors
        inputs = [t if t is not None else x for t, x in zip(saved, ctx.non_tensors)]
        q, k, v = inputs[:3]
        layout_args = inputs[3:first_option]
        options = inputs[first_option:]
        needs = list(ctx.needs_input_grad[first_option : first_option + _NUM_OPTIONAL_GRADS])
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv, *optional = backward_op(dout, dlse, q, k, v, out, lse, *layout_args, needs, *options)
        return (
            dq,
            dk,
            dv,
            *([None] * num_layout_args),
            *(g if need else None for g, need in zip(optional, needs)),
            *([None] * (len(options) - _NUM_OPTIONAL_GRADS)),
        )

    return _backward


Grads = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]


# ---- Dense ---------------------------------------------------------------------------------------


@torch.library.custom_op("fmha::attention_bwd", mutates_args=())
def attention_bwd(
    dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    needs: list[bool],
    bias: Optional[Tensor], rel_h: Optional[Tensor], rel_w: Optional[Tensor], sinks: Optional[Tensor],
    extra_k: Optional[Tensor], extra_v: Optional[Tensor], scale: Optional[float], softcap: float,
    causal: bool, bottom_right: bool, window_left: int, window_right: int, deterministic: bool,
    backward_impl: str, allow_tf32: bool,
) -> Grads:  # fmt: skip
    o = Options(bias, rel_h, rel_w, sinks, extra_k, extra_v, scale, softcap, causal, bottom_right,
                window_left, window_right, deterministic, backward_impl, allow_tf32)  # fmt: skip
    return backward(_Dense, dout, dlse, q, k, v, out, lse, (), needs, o, fake=False)


@attention_bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, needs, *options):
    return backward(_Dense, dout, dlse, q, k, v, out, lse, (), needs, Options(*options), fake=True)


@torch.library.custom_op("fmha::attention_fwd", mutates_args=())
def attention_fwd(
    q: Tensor, k: Tensor, v: Tensor,
    bias: Optional[Tensor], rel_h: Optional[Tensor], rel_w: Optional[Tensor], sinks: Optional[Tensor],
    extra_k: Optional[Tensor], extra_v: Optional[Tensor], scale: Optional[float], softcap: float,
    causal: bool, bottom_right: bool, window_left: int, window_right: int, deterministic: bool,
    backward_impl: str, allow_tf32: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    o = Options(bias, rel_h, rel_w, sinks, extra_k, extra_v, scale, softcap, causal, bottom_right,
                window_left, window_right, deterministic, backward_impl, allow_tf32)  # fmt: skip
    return forward(_Dense, q, k, v, (), o, fake=False)


@attention_fwd.register_fake
def _(q, k, v, *options):
    return forward(_Dense, q, k, v, (), Options(*options), fake=True)


attention_fwd.register_autograd(_make_backward(attention_bwd, 0), setup_context=_setup_context)


# ---- Varlen --------------------------------------------------------------------------------------


@torch.library.custom_op("fmha::attention_varlen_bwd", mutates_args=())
def attention_varlen_bwd(
    dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
    check_cu_seqlens: bool, needs: list[bool],
    bias: Optional[Tensor], rel_h: Optional[Tensor], rel_w: Optional[Tensor], sinks: Optional[Tensor],
    extra_k: Optional[Tensor], extra_v: Optional[Tensor], scale: Optional[float], softcap: float,
    causal: bool, bottom_right: bool, window_left: int, window_right: int, deterministic: bool,
    backward_impl: str, allow_tf32: bool,
) -> Grads:  # fmt: skip
    o = Options(bias, rel_h, rel_w, sinks, extra_k, extra_v, scale, softcap, causal, bottom_right,
                window_left, window_right, deterministic, backward_impl, allow_tf32)  # fmt: skip
    layout_args = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_cu_seqlens)
    return backward(_Varlen, dout, dlse, q, k, v, out, lse, layout_args, needs, o, fake=False)


@attention_varlen_bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, check, needs, *options):
    layout_args = (cu_q, cu_k, max_q, max_k, check)
    o = Options(*options)
    return backward(_Varlen, dout, dlse, q, k, v, out, lse, layout_args, needs, o, fake=True)


@torch.library.custom_op("fmha::attention_varlen_fwd", mutates_args=())
def attention_varlen_fwd(
    q: Tensor, k: Tensor, v: Tensor,
    cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
    check_cu_seqlens: bool,
    bias: Optional[Tensor], rel_h: Optional[Tensor], rel_w: Optional[Tensor], sinks: Optional[Tensor],
    extra_k: Optional[Tensor], extra_v: Optional[Tensor], scale: Optional[float], softcap: float,
    causal: bool, bottom_right: bool, window_left: int, window_right: int, deterministic: bool,
    backward_impl: str, allow_tf32: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    o = Options(bias, rel_h, rel_w, sinks, extra_k, extra_v, scale, softcap, causal, bottom_right,
                window_left, window_right, deterministic, backward_impl, allow_tf32)  # fmt: skip
    layout_args = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_cu_seqlens)
    return forward(_Varlen, q, k, v, layout_args, o, fake=False)


@attention_varlen_fwd.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, check, *options):
    layout_args = (cu_q, cu_k, max_q, max_k, check)
    return forward(_Varlen, q, k, v, layout_args, Options(*options), fake=True)


attention_varlen_fwd.register_autograd(
    _make_backward(attention_varlen_bwd, 5), setup_context=_setup_context
)


# ---- Neighborhood --------------------------------------------------------------------------------


@torch.library.custom_op("fmha::neighborhood_bwd", mutates_args=())
def neighborhood_bwd(
    dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    kernel_size: list[int], dilation: list[int], is_causal: list[bool],
    needs: list[bool],
    bias: Optional[Tensor], rel_h: Optional[Tensor], rel_w: Optional[Tensor], sinks: Optional[Tensor],
    extra_k: Optional[Tensor], extra_v: Optional[Tensor], scale: Optional[float], softcap: float,
    causal: bool, bottom_right: bool, window_left: int, window_right: int, deterministic: bool,
    backward_impl: str, allow_tf32: bool,
) -> Grads:  # fmt: skip
    o = Options(bias, rel_h, rel_w, sinks, extra_k, extra_v, scale, softcap, causal, bottom_right,
                window_left, window_right, deterministic, backward_impl, allow_tf32)  # fmt: skip
    layout_args = (kernel_size, dilation, is_causal)
    return backward(_Neighborhood, dout, dlse, q, k, v, out, lse, layout_args, needs, o, fake=False)


@neighborhood_bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, kernel_size, dilation, is_causal, needs, *options):
    layout_args = (kernel_size, dilation, is_causal)
    o = Options(*options)
    return backward(_Neighborhood, dout, dlse, q, k, v, out, lse, layout_args, needs, o, fake=True)


@torch.library.custom_op("fmha::neighborhood_fwd", mutates_args=())
def neighborhood_fwd(
    q: Tensor, k: Tensor, v: Tensor,
    kernel_size: list[int], dilation: list[int], is_causal: list[bool],
    bias: Optional[Tensor], rel_h: Optional[Tensor], rel_w: Optional[Tensor], sinks: Optional[Tensor],
    extra_k: Optional[Tensor], extra_v: Optional[Tensor], scale: Optional[float], softcap: float,
    causal: bool, bottom_right: bool, window_left: int, window_right: int, deterministic: bool,
    backward_impl: str, allow_tf32: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    o = Options(bias, rel_h, rel_w, sinks, extra_k, extra_v, scale, softcap, causal, bottom_right,
                window_left, window_right, deterministic, backward_impl, allow_tf32)  # fmt: skip
    return forward(_Neighborhood, q, k, v, (kernel_size, dilation, is_causal), o, fake=False)


@neighborhood_fwd.register_fake
def _(q, k, v, kernel_size, dilation, is_causal, *options):
    layout_args = (kernel_size, dilation, is_causal)
    return forward(_Neighborhood, q, k, v, layout_args, Options(*options), fake=True)


neighborhood_fwd.register_autograd(
    _make_backward(neighborhood_bwd, 3), setup_context=_setup_context
)


# ---- The eager path ------------------------------------------------------------------------------


def _none():
    return None


def _eager_function(layout):
    """The autograd.Function of a layout's eager calls: forward() and backward() of this module
    with the inputs and gradients of the layout's ops. Its inputs are q, k, v, the layout's
    arguments (one tuple), the Options and, only when any is given, the optional tensors again
    (bias, rel_h, rel_w, sinks, extra_k, extra_v): the inputs besides q, k, v that gradients flow
    to. Function.apply costs about 0.1 us an input, so the options as 15 inputs of their own
    cost 1.6 us a call (CPU tensors, 2-core EPYC, 2026-11-28). Its ctx keeps less than the ops' glue
    (_setup_context, _make_backward), which saves every input by position: q, k, v, out, lse and
    the optional tensors go through save_for_backward (so in-place changes are caught), varlen's
    offsets too, and the scalars stay on ctx as one tuple; a call without optional tensors keeps
    its Options whole (they hold no tensor), which the backward reuses."""

    def run_backward(ctx, dout, dlse):
        q, k, v, out, lse, *saved = ctx.saved_tensors
        o = ctx.options
        needs = ()  # read only where an optional tensor is given
        if o is None:
            o = Options(*saved[:_NUM_OPTIONAL_GRADS], *ctx.scalars)
            saved = saved[_NUM_OPTIONAL_GRADS:]
            needs = ctx.needs_input_grad[5:]
        layout_args = ()
        if ctx.layout_args:
            offsets = iter(saved)
            layout_args = [next(offsets) if a is None else a for a in ctx.layout_args]
        if dout is None:
            dout = torch.zeros_like(out)
        # Gradients not asked for (or of options not given) come back as None.
        grads = backward(
            layout, dout, dlse, q, k, v, out, lse, layout_args, needs, o, fake=False,
            unasked=_none, views=ctx.views,
        )  # fmt: skip
        # The graph may outlive its backward (an output kept): it keeps no view (a backward of a
        # retained graph makes its own).
        ctx.views = None
        if needs:
            return (*grads[:3], None, None, *grads[3:])
        return (*grads[:3], None, None)

    # As the ops' backward: no autograd of its own. once_differentiable runs the backward under
    # torch.no_grad() and then, where grad mode is on (create_graph=True), makes its gradients
    # refuse a second differentiation; in grad mode off, as in every plain backward, it changes
    # nothing and its context manager alone costs about 1 us, so that case calls run_backward.
    run_backward_once = torch.autograd.function.once_differentiable(run_backward)

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, layout_args, o, *optional):
            # Like the op's: gradients not flowing in stay None (no zeros made for an unused lse).
            ctx.set_materialize_grads(False)
            ctx.views = []  # q, k, v, out, lse as the C++ layer sees them: the backward's too
            out, lse = forward(layout, q, k, v, layout_args, o, fake=False, views=ctx.views)
            offsets = ()
            ctx.layout_args = layout_args
            if layout_args:
                offsets = [a for a in layout_args if isinstance(a, Tensor)]
                ctx.layout_args = [None if isinstance(a, Tensor) else a for a in layout_args]
            if optional:
                ctx.options = None
                ctx.scalars = o[_NUM_OPTIONAL_GRADS:]
                ctx.save_for_backward(q, k, v, out, lse, *optional, *offsets)
            else:
                ctx.options = o
                ctx.save_for_backward(q, k, v, out, lse, *offsets)
            return out, lse

        @staticmethod
        def backward(ctx, dout, dlse):
            if torch.is_grad_enabled():
                return run_backward_once(ctx, dout, dlse)
            return run_backward(ctx, dout, dlse)

    return Eager


_EAGER = {
    attention_fwd: _eager_function(_Dense),
    attention_varlen_fwd: _eager_function(_Varlen),
    neighborhood_fwd: _eager_function(_Neighborhood),
}


# torch's private queries behind _no_op_observers, looked up once; a torch without them keeps the
# op (a dispatch stack that always holds a mode). The stack's length counts the infrastructure
# modes too (FakeTensorMode, FunctionalTensorMode, the proxy mode), not only the user's.
_dispatch_stack_len = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 1)
_functorch_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)


def _no_op_observers() -> bool:
    """No dispatch mode (fake tensors, flop counters, ...) and no functorch transform is active:
    nothing that needs to see the op."""
    return not _dispatch_stack_len() and not _functorch_transforms_active()


def _takes_eager_path(q: Tensor) -> bool:
    """Whether a call on q may skip the op: a plain tensor on a device with a backend (meta tensors
    take the op's fake kernel), outside torch.compile, torch.jit.trace (which records the op, not
    the C++ call behind the Function) and anything that observes ops (_no_op_observers)."""
    return (
        type(q) is Tensor
        and (q.is_cpu or q.is_cuda)
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and _no_op_observers()
    )


_LAYOUTS = {attention_fwd: (_Dense, 0), attention_varlen_fwd: (_Varlen, 5),
            neighborhood_fwd: (_Neighborhood, 3)}


def call(op, q: Tensor, k: Tensor, v: Tensor, *args):
    """A forward op's call with autograd: op(q, k, v, *args), or on the eager path its Function's,
    or forward() itself when no gradient can flow (grad mode off, or no input that requires one):
    the same outputs, without the Function's bookkeeping (about 5 us a call)."""
    num_layout_args = _LAYOUTS[op][1]
    return call_options(op, q, k, v, args[:num_layout_args], Options(*args[num_layout_args:]))


def call_options(op, q: Tensor, k: Tensor, v: Tensor, layout_args: tuple, o: Options):
    """call() with the layout's arguments and the Options as they are, for the public functions,
    which have them so: not unpacked into the op's arguments and gathered again."""
    if not _takes_eager_path(q):
        return op(q, k, v, *layout_args, *o)
    optional = o[:_NUM_OPTIONAL_GRADS] if _has_optional_tensors(o) else ()
    if (
        _forward_ad._current_level >= 0  # forward-mode AD: the Function says what it lacks
        or torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad
            or any(t is not None and t.requires_grad for t in optional)
        )
    ):  # fmt: skip
        return _EAGER[op].apply(q, k, v, layout_args, o, *optional)
    return forward(_LAYOUTS[op][0], q, k, v, layout_args, o, fake=False)
