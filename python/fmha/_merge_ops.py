"""torch.library custom ops for merging partial attentions (SPEC §12), forward and backward."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _C, _bridge
from ._attention_ops import _dense


def _views(tensors: list[Tensor], name: str, planned: bool) -> list:
    return [_bridge.view(t, f"{name}[{i}]", planned=planned) for i, t in enumerate(tensors)]


def _merged_like(tensors: list[Tensor], rank: int):
    """(shape, dtype) of the merged result: that of the first part (C++ checks that all agree).
    Without a usable first part, an empty placeholder of the right rank lets the C++ check name
    the offending part instead of the merged output."""
    if tensors and tensors[0].dim() == rank:
        return tuple(tensors[0].shape), tensors[0].dtype
    return (0,) * rank, (tensors[0].dtype if tensors else torch.float32)


def _device(outs: list[Tensor], lses: list[Tensor]) -> torch.device:
    parts = outs or lses
    return parts[0].device if parts else torch.device("cpu")


@torch.library.custom_op("fmha::merge_fwd", mutates_args=())
def merge_fwd(outs: list[Tensor], lses: list[Tensor]) -> tuple[Tensor, Tensor]:
    return _merge_forward(outs, lses, fake=False)


@merge_fwd.register_fake
def _(outs, lses):
    return _merge_forward(outs, lses, fake=True)


def _merge_forward(outs, lses, *, fake: bool):
    out_shape, out_dtype = _merged_like(outs, 4)
    lse_shape, lse_dtype = _merged_like(lses, 3)
    device = _device(outs, lses)
    if fake and (outs or lses):
        named = [(f"outs[{i}]", t) for i, t in enumerate(outs)]
        _bridge.check_devices(*named, *((f"lses[{i}]", t) for i, t in enumerate(lses)))
    params = _C.MergeForwardParams()
    if not fake or _bridge.is_static(*outs, *lses):
        params.outs = _views(outs, "outs", planned=fake)
        params.lses = _views(lses, "lses", planned=fake)
        params.out = _bridge.planned_contiguous(out_shape, out_dtype, device, "out")
        params.lse = _bridge.planned_contiguous(lse_shape, lse_dtype, device, "lse")
        _bridge.check(params)  # refuse before allocating anything
    out = torch.empty(out_shape, dtype=out_dtype, device=device)
    lse = torch.empty(lse_shape, dtype=lse_dtype, device=device)
    if not fake:
        params.out = _bridge.view(out, "out")
        params.lse = _bridge.view(lse, "lse")
        _bridge.run(params, device)
    return out, lse


@torch.library.custom_op("fmha::merge_bwd", mutates_args=())
def merge_bwd(
    dout: Tensor, dlse: Optional[Tensor], outs: list[Tensor], lses: list[Tensor], out: Tensor,
    lse: Tensor,
) -> tuple[list[Tensor], list[Tensor]]:  # fmt: skip
    douts = [torch.empty_like(t) for t in outs]
    dlses = [torch.empty_like(t) for t in lses]
    params = _C.MergeBackwardParams()
    params.outs = _views(outs, "outs", planned=False)
    params.lses = _views(lses, "lses", planned=False)
    params.out = _bridge.view(out, "out")
    params.lse = _bridge.view(lse, "lse")
    # Views hold raw addresses: every tensor they describe must stay referenced until run().
    dout, dlse = _dense(dout), _dense(dlse)
    params.dout = _bridge.view(dout, "dout")
    params.dlse = _bridge.view(dlse, "dlse")
    params.douts = _views(douts, "douts", planned=False)
    params.dlses = _views(dlses, "dlses", planned=False)
    _bridge.run(params, out.device)
    return douts, dlses


@merge_bwd.register_fake
def _(dout, dlse, outs, lses, out, lse):
    return [torch.empty_like(t) for t in outs], [torch.empty_like(t) for t in lses]


def _setup_context(ctx, inputs, output) -> None:
    outs, lses = inputs
    ctx.num_parts = len(outs)
    ctx.save_for_backward(*outs, *lses, *output)


def _backward(ctx, dout, dlse):
    *parts, out, lse = ctx.saved_tensors
    outs, lses = parts[: ctx.num_parts], parts[ctx.num_parts :]
    if dout is None:
        dout = torch.zeros_like(out)
    douts, dlses = merge_bwd(dout, dlse, list(outs), list(lses), out, lse)
    return douts, dlses


merge_fwd.register_autograd(_backward, setup_context=_setup_context)
