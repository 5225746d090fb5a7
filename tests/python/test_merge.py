"""fmha.merge_attentions: parts over disjoint key sets merge into attention over all keys, with
gradients through the merge; -inf parts; gradcheck of the merge itself."""

from __future__ import annotations

import math

import pytest
import torch

import attention_reference as reference
import fmha
from harness import compare, dtype_params, gradcheck, randn


def split_attention(q, k, v, sinks=None, splits=(4, 9)):
    """Attention over key blocks [0, 4), [4, 9), [9, Lk), merged; sinks in the first part only."""
    bounds = [0, *splits, k.shape[1]]
    outs, lses = [], []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        out, lse = fmha.attention(q, k[:, a:b], v[:, a:b], sinks=sinks if i == 0 else None,
                                  return_lse=True)  # fmt: skip
        outs.append(out)
        lses.append(lse)
    return fmha.merge_attentions(outs, lses)


@pytest.mark.parametrize("device,dtype", dtype_params())
@pytest.mark.parametrize("with_sinks", [False, True], ids=["plain", "sinks"])
def test_split_then_merge_equals_full_attention(device, dtype, with_sinks):
    b, lq, lk, h, d = 2, 7, 13, 4, 8
    inputs = {"q": randn(b, lq, h, d, seed=0), "k": randn(b, lk, 2, d, seed=1),
              "v": randn(b, lk, 2, d, seed=2)}  # fmt: skip
    if with_sinks:
        inputs["sinks"] = randn(h, seed=3)
    compare(device, dtype, split_attention, reference.attention, inputs)


@pytest.mark.parametrize("device,dtype", dtype_params())
def test_merge_matches_reference_merge(device, dtype):
    # Parts given directly (three of them), one with -inf rows: its contribution is zero.
    b, lq, h, dv = 2, 5, 3, 6
    lse_c = randn(b, h, lq, seed=6)
    lse_c[:, :, 1] = -math.inf
    inputs = {"out_a": randn(b, lq, h, dv, seed=1), "out_b": randn(b, lq, h, dv, seed=2),
              "out_c": randn(b, lq, h, dv, seed=3), "lse_a": randn(b, h, lq, seed=4),
              "lse_b": randn(b, h, lq, seed=5), "lse_c": lse_c}  # fmt: skip

    def run_fmha(out_a, out_b, out_c, lse_a, lse_b, lse_c):
        return fmha.merge_attentions([out_a, out_b, out_c], [lse_a, lse_b, lse_c])

    def run_reference(out_a, out_b, out_c, lse_a, lse_b, lse_c):
        return reference.merge([out_a, out_b, out_c], [lse_a, lse_b, lse_c])

    stats = ("lse_a", "lse_b", "lse_c")
    compare(device, dtype, run_fmha, run_reference, inputs, stat_inputs=stats)


def test_all_parts_minus_inf_give_zero_and_minus_inf():
    out = torch.randn(1, 3, 2, 4, dtype=torch.float64)
    lse = torch.full((1, 2, 3), -math.inf, dtype=torch.float64)
    merged, merged_lse = fmha.merge_attentions([out, out], [lse, lse])
    assert torch.equal(merged, torch.zeros_like(merged))
    assert torch.isinf(merged_lse).all() and (merged_lse < 0).all()


def test_gradcheck():
    b, lq, h, dv = 1, 3, 2, 3
    tensors = (randn(b, lq, h, dv, seed=1), randn(b, lq, h, dv, seed=2),
               randn(b, h, lq, seed=3), randn(b, h, lq, seed=4))  # fmt: skip
    for t in tensors:
        t.requires_grad_(True)
    gradcheck(lambda oa, ob, la, lb: fmha.merge_attentions([oa, ob], [la, lb]), tensors)


def test_single_part_is_identity():
    out = torch.randn(2, 3, 2, 4)
    lse = torch.randn(2, 2, 3)
    merged, merged_lse = fmha.merge_attentions([out], [lse])
    torch.testing.assert_close(merged, out)
    torch.testing.assert_close(merged_lse, lse)
