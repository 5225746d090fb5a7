"""Bad arguments: ValueError (TypeError for dtypes) carrying the library's message (SPEC §14),
raised before anything is allocated or run; unsupported-but-valid calls: NotImplementedError."""

from __future__ import annotations

import pytest
import torch

import fmha
import fmha._bridge
from harness import DEVICES


def _qkv(device, b=2, lq=5, lk=6, h=4, hkv=2, d=8, dv=8, dtype=torch.float32):
    return (torch.randn(b, lq, h, d, device=device, dtype=dtype),
            torch.randn(b, lk, hkv, d, device=device, dtype=dtype),
            torch.randn(b, lk, hkv, dv, device=device, dtype=dtype))  # fmt: skip


def _cu(device, *offsets):
    return torch.tensor(offsets, dtype=torch.int32, device=device)


# name -> (call(device), exception, message fragments that must appear)
CASES = {
    "heads_not_multiple": (
        lambda dev: fmha.attention(*_qkv(dev, h=4, hkv=3)), ValueError,
        ["fmha: ", "k has 3 heads but q has 4", "multiple"]),
    "k_dtype_differs": (
        lambda dev: fmha.attention(_qkv(dev)[0], *_qkv(dev, dtype=torch.float16)[1:]), TypeError,
        ["fmha: k has dtype float16 but q has float32"]),
    "integer_q": (
        lambda dev: fmha.attention(*(x.long() for x in _qkv(dev))), TypeError,
        ["fmha: q has dtype torch.int64", "accepted"]),
    "q_rank": (
        lambda dev: fmha.attention(_qkv(dev)[0][0], *_qkv(dev)[1:]), ValueError,
        ["fmha: q has rank 3", "expected rank 4"]),
    "seqlen_k_mismatch": (
        lambda dev: fmha.attention(*_qkv(dev)[:2], _qkv(dev, lk=7)[2]), ValueError,
        ["fmha: v has shape [2, 7, 2, 8]", "Lk"]),
    "head_dim_too_large": (
        lambda dev: fmha.attention(*_qkv(dev, d=300, dv=8)), ValueError,
        ["D = 300", "1..256"]),
    "bias_not_broadcastable": (
        lambda dev: fmha.attention(*_qkv(dev), bias=torch.randn(3, 5, 6, device=dev)), ValueError,
        ["fmha: options.bias has shape [1, 3, 5, 6]", "H, is 3 but must be 4"]),
    "bias_dtype": (
        lambda dev: fmha.attention(*_qkv(dev), bias=torch.randn(4, 5, 6, device=dev).double()),
        TypeError, ["options.bias has dtype float64"]),
    "rel_pos_grid": (
        lambda dev: fmha.attention(*_qkv(dev), rel_pos=(torch.randn(2, 4, 5, 2, device=dev),
                                                        torch.randn(2, 4, 5, 2, device=dev))),
        ValueError, ["Hk * Wk = Lk"]),
    "sinks_shape": (
        lambda dev: fmha.attention(*_qkv(dev), sinks=torch.randn(3, device=dev)), ValueError,
        ["options.sinks has shape [3]"]),
    "sinks_dtype": (
        lambda dev: fmha.attention(*_qkv(dev), sinks=torch.randn(4, device=dev).half()), TypeError,
        ["options.sinks has dtype float16", "float32"]),
    "extra_kv_heads": (
        lambda dev: fmha.attention(*_qkv(dev), extra_kv=(torch.randn(2, 3, 4, 8, device=dev),
                                                         torch.randn(2, 3, 4, 8, device=dev))),
        ValueError, ["options.extra_k has shape [2, 3, 4, 8]"]),
    "window_negative": (
        lambda dev: fmha.attention(*_qkv(dev), window=(-2, 0)), ValueError,
        ["window_left = -2", "-1 (unbounded)"]),
    "window_not_pair": (
        lambda dev: fmha.attention(*_qkv(dev), window=3), ValueError,
        ["fmha: window is 3", "(left, right)"]),
    "causal_alignment": (
        lambda dev: fmha.attention(*_qkv(dev), causal=True, causal_alignment="bottom"), ValueError,
        ["fmha: causal_alignment is 'bottom'", "'bottom_right'"]),
    "backward_impl": (
        lambda dev: fmha.attention(*_qkv(dev), backward_impl="fast"), ValueError,
        ["fmha: backward_impl is 'fast'", "'auto', 'fused', 'split'"]),
    "softcap_negative": (
        lambda dev: fmha.attention(*_qkv(dev), softcap=-1.0), ValueError,
        ["softcap = -1", ">= 0"]),
    "scale_nan": (
        lambda dev: fmha.attention(*_qkv(dev), scale=float("nan")), ValueError,
        ["scale = nan", "finite"]),
    "q_not_a_tensor": (
        lambda dev: fmha.attention([1.0], *_qkv(dev)[1:]), TypeError,
        ["fmha: q must be a torch.Tensor"]),
    "varlen_offsets_total": (
        lambda dev: fmha.attention_varlen(torch.randn(9, 2, 8, device=dev), torch.randn(9, 2, 8, device=dev),
                                          torch.randn(9, 2, 8, device=dev), _cu(dev, 0, 4, 8), _cu(dev, 0, 4, 9), 5, 5),
        ValueError, ["cu_seqlens_q[2] = 8 but q has 9 rows"]),
    "varlen_max_seqlen": (
        lambda dev: fmha.attention_varlen(torch.randn(9, 2, 8, device=dev), torch.randn(9, 2, 8, device=dev),
                                          torch.randn(9, 2, 8, device=dev), _cu(dev, 0, 2, 9), _cu(dev, 0, 2, 9), 5, 7),
        ValueError, ["sequence 1 has 7 rows", "max_seqlen_q = 5"]),
    "varlen_cu_dtype": (
        lambda dev: fmha.attention_varlen(torch.randn(9, 2, 8, device=dev), torch.randn(9, 2, 8, device=dev),
                                          torch.randn(9, 2, 8, device=dev), _cu(dev, 0, 9).long(), _cu(dev, 0, 9), 9, 9),
        TypeError, ["cu_seqlens_q has dtype torch.int64"]),
    "varlen_rel_pos": (
        lambda dev: fmha.attention_varlen(torch.randn(4, 2, 8, device=dev), torch.randn(4, 2, 8, device=dev),
                                          torch.randn(4, 2, 8, device=dev), _cu(dev, 0, 4), _cu(dev, 0, 4), 4, 4,
                                          rel_pos=(torch.randn(1, 2, 4, 2, device=dev), torch.randn(1, 2, 4, 2, device=dev))),
        ValueError, ["not accepted for variable-length batches"]),
    "na_kernel_too_large": (
        lambda dev: fmha.na2d(*(torch.randn(1, 4, 5, 2, 8, device=dev) for _ in range(3)), 3, 2), ValueError,
        ["kernel_size[0] * dilation[0] = 6 exceeds the grid size 4"]),
    "na_tuple_length": (
        lambda dev: fmha.na3d(*(torch.randn(1, 4, 4, 4, 2, 8, device=dev) for _ in range(3)), (3, 3)), ValueError,
        ["fmha: kernel_size is (3, 3) with 2 entries", "na3d"]),
    "na_kernel_float": (
        lambda dev: fmha.na1d(*(torch.randn(1, 8, 2, 8, device=dev) for _ in range(3)), 3.5), TypeError,
        ["fmha: kernel_size is 3.5 (float); accepted: an int"]),
    # Found by the fuzzing harness (test_fuzz.py): scalar arguments of the wrong type raised Python's
    # own message, which does not name the argument, or were taken for something they are not.
    "scale_string": (
        lambda dev: fmha.attention(*_qkv(dev), scale="0.5"), TypeError,
        ["fmha: scale is '0.5' (str); accepted: a float"]),
    "softcap_none": (
        lambda dev: fmha.attention(*_qkv(dev), softcap=None), TypeError, ["fmha: softcap is None"]),
    "causal_string": (
        lambda dev: fmha.attention(*_qkv(dev), causal="False"), TypeError,
        ["fmha: causal is 'False' (str); accepted: a bool"]),
    "deterministic_tensor": (
        lambda dev: fmha.attention(*_qkv(dev), deterministic=torch.ones(2, dtype=torch.bool)),
        TypeError, ["fmha: deterministic is tensor(", "accepted: a bool"]),
    "return_lse_string": (
        lambda dev: fmha.attention(*_qkv(dev), return_lse="yes"), TypeError, ["fmha: return_lse is 'yes'"]),
    "window_float": (
        lambda dev: fmha.attention(*_qkv(dev), window=(1.5, 2)), TypeError,
        ["fmha: window[0] is 1.5 (float); accepted: an int"]),
    "window_past_int64": (
        lambda dev: fmha.attention(*_qkv(dev), window=(0, 2**63)), ValueError,
        ["fmha: window[1] = 9223372036854775808 does not fit in a signed 64-bit integer"]),
    "varlen_max_seqlen_float": (
        lambda dev: fmha.attention_varlen(torch.randn(9, 2, 8, device=dev), torch.randn(9, 2, 8, device=dev),
                                          torch.randn(9, 2, 8, device=dev), _cu(dev, 0, 9), _cu(dev, 0, 9), 9.0, 9),
        TypeError, ["fmha: max_seqlen_q is 9.0 (float); accepted: an int"]),
    "varlen_max_seqlen_none": (
        lambda dev: fmha.attention_varlen(torch.randn(9, 2, 8, device=dev), torch.randn(9, 2, 8, device=dev),
                                          torch.randn(9, 2, 8, device=dev), _cu(dev, 0, 9), _cu(dev, 0, 9), 9, None),
        TypeError, ["fmha: max_seqlen_k is None"]),
    "na_dilation_past_int64": (
        lambda dev: fmha.na2d(*(torch.randn(1, 4, 5, 2, 8, device=dev) for _ in range(3)), 3, (1, 2**64)),
        ValueError, ["fmha: dilation[1] = 18446744073709551616 does not fit"]),
    "na_is_causal_string": (
        lambda dev: fmha.na1d(*(torch.randn(1, 8, 2, 8, device=dev) for _ in range(3)), 3, is_causal="yes"),
        TypeError, ["fmha: is_causal is 'yes' (str); accepted: a bool"]),
    # A meta tensor among real ones took the shape-only path and passed; now refused like any
    # other device mismatch.
    "meta_q_among_real_tensors": (
        lambda dev: fmha.attention(_qkv(dev)[0].to("meta"), *_qkv(dev)[1:]), ValueError,
        ["fmha: k is on ", "but q is on meta; every tensor must be on q's device"]),
    "merge_meta_part_among_real_ones": (
        lambda dev: fmha.merge_attentions([torch.randn(1, 3, 2, 4, device=dev)] * 2,
                                          [torch.randn(1, 2, 3, device=dev), torch.randn(1, 2, 3, device="meta")]),
        ValueError, ["fmha: lses[1] is on meta but outs[0] is on "]),
    "na_backward_impl": (
        lambda dev: fmha.na1d(*(torch.randn(1, 8, 2, 8, device=dev) for _ in range(3)), 3, backward_impl=None),
        ValueError, ["fmha: backward_impl is None", "'auto', 'fused', 'split'"]),
    "na_rank": (
        lambda dev: fmha.na2d(*(torch.randn(1, 8, 2, 8, device=dev) for _ in range(3)), 3), ValueError,
        ["fmha: q has rank 4"]),
    "merge_shapes": (
        lambda dev: fmha.merge_attentions([torch.randn(1, 3, 2, 4, device=dev), torch.randn(1, 4, 2, 4, device=dev)],
                                          [torch.randn(1, 2, 3, device=dev), torch.randn(1, 2, 4, device=dev)]),
        ValueError, ["outs[1] has shape [1, 4, 2, 4]"]),
    "merge_counts": (
        lambda dev: fmha.merge_attentions([torch.randn(1, 3, 2, 4, device=dev)] * 2, [torch.randn(1, 2, 3, device=dev)]),
        ValueError, ["merge got 2 outs but 1 lses"]),
    "merge_empty": (
        lambda dev: fmha.merge_attentions([], []), ValueError, ["merge needs at least one part"]),
    "merge_lse_dtype": (
        lambda dev: fmha.merge_attentions([torch.randn(1, 3, 2, 4, device=dev)], [torch.randn(1, 2, 3, device=dev).half()]),
        TypeError, ["lses[0] has dtype float16"]),
}  # fmt: skip


# The library reads cu_seqlens values only on the CPU: checking CUDA offsets would need a device
# synchronisation, so CUDA callers own that contract (documented in attention_varlen).
_CPU_ONLY = {"varlen_offsets_total", "varlen_max_seqlen"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_arguments_raise_with_the_library_message(case, device, monkeypatch):
    if device == "cuda" and case in _CPU_ONLY:
        pytest.skip("cu_seqlens values on CUDA are not read by the library (no device sync)")
    make_call, exception, fragments = CASES[case]
    runs = []

    # _bridge.run and run_shaped (the attention calls') stand in for the C++ run without its
    # backends: the check that fmha::run makes first (src/api/dispatch.cpp), then a record of the
    # run that would follow. The forward leaves its check to run, as a user's call of the C++ API
    # does.
    def checked_run(params, device):
        fmha._bridge.check(params)
        runs.append(params)

    monkeypatch.setattr(fmha._bridge, "run", checked_run)
    monkeypatch.setattr(fmha._bridge, "run_shaped", checked_run)
    with pytest.raises(exception) as error:
        make_call(device)
    for fragment in fragments:
        assert fragment in str(error.value), f"{fragment!r} not in {str(error.value)!r}"
    assert not runs, "a backend ran although the arguments were refused"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")
def test_cuda_refuses_float64_with_a_clear_message():
    q = torch.randn(1, 4, 2, 8, device="cuda", dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="float64 is only supported on CPU"):
        fmha.attention(q, q, q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")
def test_mixed_devices_are_refused():
    q = torch.randn(1, 4, 2, 8, device="cuda")
    with pytest.raises(ValueError, match="k is on cpu but q is on cuda:0"):
        fmha.attention(q, q.cpu(), q)


def test_cuda_tensors_without_cuda_backend_are_refused_clearly():
    if fmha.built_with_cuda() or not torch.cuda.is_available():
        pytest.skip("needs a GPU and an fmha build without the CUDA backend")
    q = torch.randn(1, 4, 2, 8, device="cuda")
    with pytest.raises(NotImplementedError, match="no CUDA backend"):
        fmha.attention(q, q, q)


def test_meta_tensors_give_output_shapes_without_computing():
    q = torch.randn(2, 4, 3, 8, device="meta")
    k = torch.randn(2, 6, 1, 8, device="meta")
    out, lse = fmha.attention(q, k, k, return_lse=True)
    assert out.device.type == "meta" and out.shape == (2, 4, 3, 8) and lse.shape == (2, 3, 4)


def test_too_many_dimensions_are_refused():
    q = torch.randn(1, 1, 1, 1, 1, 2, 8)
    with pytest.raises(ValueError, match="fmha: q has 7 dimensions"):
        fmha.na3d(q, q, q, 1)
