"""Shared machinery of the Python tests: devices, dtypes, tolerances (SPEC §13) and the
forward-plus-every-gradient comparison of an fmha call against the float64 reference."""

from __future__ import annotations

import math
from typing import Callable, Optional

import pytest
import torch

from cuda_refusals import expected_cuda_refusal

# CUDA runs whenever torch sees a GPU; otherwise its half of every test is skipped, visibly.
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch"),
    ),
]

# The CPU backend takes float64 (exact gradient checks); the CUDA backend refuses it. The CPU
# backend computes every dtype in double, so its fp16/bf16 runs only need a few cases.
DTYPES = {
    "cpu": [torch.float64, torch.float32, torch.bfloat16, torch.float16],
    "cuda": [torch.float32, torch.bfloat16, torch.float16],
}
_LOW_PRECISION = (torch.float16, torch.bfloat16)
# One dtype per device for tests about something other than precision.
WORKING_DTYPE = {"cpu": torch.float32, "cuda": torch.bfloat16}


def case_params(cases, cpu_low_precision_cases):
    """(case, device, dtype) for parametrize: every case in every dtype of each device, except
    that fp16/bf16 on the CPU run only cpu_low_precision_cases."""
    params = []
    for case in cases:
        for device in DEVICES:
            name = device.values[0]
            for dtype in DTYPES[name]:
                if name == "cpu" and dtype in _LOW_PRECISION and case not in cpu_low_precision_cases:
                    continue
                params.append(pytest.param(case, name, dtype, id=f"{case}-{name}-{str(dtype)[6:]}",
                                           marks=device.marks))  # fmt: skip
    return params


def dtype_params():
    """(device, dtype) pairs for parametrize: every dtype of each device."""
    return [pytest.param(name, dtype, id=f"{name}-{str(dtype)[6:]}", marks=device.marks)
            for device in DEVICES for name in device.values for dtype in DTYPES[name]]  # fmt: skip


def call(device: str, fn: Callable, *args, **kwargs):
    """Runs an fmha call. On CUDA a valid call that the backend does not cover must raise
    NotImplementedError with a message that names the library and says what is refused, and be one
    of EXPECTED_CUDA_REFUSALS: the test then skips with that message, so the report shows what the
    CUDA backend still lacks. Any other refusal fails the test."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as error:
        if device == "cpu":
            raise
        message = str(error)
        assert message.startswith("fmha: ") and len(message) > 30, f"unclear refusal: {message!r}"
        case = expected_cuda_refusal(message)
        if case is None:
            pytest.fail(f"unexpected CUDA refusal (not in EXPECTED_CUDA_REFUSALS): {message}")
        pytest.skip(f"CUDA backend refuses this case ({case}): {message}")


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Norm-wise relative error ||x - ref|| / ||ref|| over finite entries (absolute when ref is 0)."""
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    finite = torch.isfinite(ref)
    diff = torch.linalg.vector_norm((x - ref)[finite])
    scale = torch.linalg.vector_norm(ref[finite])
    return float(diff / scale) if scale > 0 else float(diff)


def tolerance(dtype: torch.dtype, allow_tf32: bool = False) -> float:
    if dtype == torch.float64:
        return 1e-10
    if dtype == torch.float32:
        return 2e-3 if allow_tf32 else 1e-5
    raise ValueError("fp16/bf16 use the naive same-dtype bound")


def assert_close(name: str, x: torch.Tensor, ref: torch.Tensor, bound: float) -> None:
    assert x.shape == ref.shape, f"{name}: shape {tuple(x.shape)} vs reference {tuple(ref.shape)}"
    x_cpu, ref_cpu = x.detach().double().cpu(), ref.detach().double().cpu()
    assert not torch.isnan(x_cpu).any(), f"{name}: NaN at {torch.isnan(x_cpu).nonzero()[0].tolist()}"
    inf_mismatch = torch.isinf(x_cpu) != torch.isinf(ref_cpu)
    assert not inf_mismatch.any(), f"{name}: inf pattern differs at {inf_mismatch.nonzero()[0].tolist()}"
    error = rel_error(x_cpu, ref_cpu)
    if error <= bound:
        return
    finite = torch.isfinite(ref_cpu)
    diff = torch.where(finite, (x_cpu - ref_cpu).abs(), 0.0)
    first = (diff > bound * ref_cpu.abs().max().clamp_min(1e-30)).nonzero()
    where = first[0].tolist() if len(first) else "n/a"
    pytest.fail(
        f"{name}: relative error {error:.3e} > {bound:.3e} (max abs {diff.max():.3e}, mean abs "
        f"{diff.mean():.3e}, first bad index {where})"
    )


def _finite(lse: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def compare(
    device: str,
    dtype: torch.dtype,
    run_fmha: Callable[..., tuple],
    run_reference: Callable[..., tuple],
    inputs: dict[str, torch.Tensor],
    *,
    stat_inputs: tuple = ("sinks",),
    leaf_views: Optional[dict] = None,
    allow_tf32: bool = False,
    seed: int = 0,
) -> None:
    """Checks (out, lse) and the gradient of every input against the float64 reference.

    inputs: float64 CPU masters by name; run_fmha(**tensors) and run_reference(**tensors) return
    (out, lse). fmha gets them in `dtype` on `device` (stat_inputs such as sinks stay float32 except
    for float64 runs); the loss is <out, g_out> + <lse, g_lse>, so dlse is exercised as well.
    leaf_views: name -> function making the leaf tensor a view (e.g. a stride-0 expand) of the
    cast master, so that the leaf itself, not a tensor it came from, has that layout."""
    leaf_views = leaf_views or {}

    def prepared(target_dtype, target_device, stats_dtype):
        tensors = {}
        for name, master in inputs.items():
            cast = stats_dtype if name in stat_inputs else target_dtype
            leaf = master.detach().to(target_device, cast)
            if name in leaf_views:
                leaf = leaf_views[name](leaf).detach()
            tensors[name] = leaf.requires_grad_(True)
        return tensors

    stats_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    ours = prepared(dtype, device, stats_dtype)
    ref = prepared(torch.float64, "cpu", torch.float64)

    out, lse = call(device, run_fmha, **ours)
    ref_out, ref_lse = run_reference(**ref)
    generator = torch.Generator().manual_seed(seed)
    g_out = torch.randn(ref_out.shape, generator=generator, dtype=torch.float64)
    g_lse = torch.randn(ref_lse.shape, generator=generator, dtype=torch.float64)

    def gradients(out_, lse_, tensors):
        loss = (out_.double().cpu() * g_out).sum() + (_finite(lse_.double().cpu()) * g_lse).sum()
        return torch.autograd.grad(loss, list(tensors.values()), allow_unused=True)

    grads = call(device, gradients, out, lse, ours)
    ref_grads = gradients(ref_out, ref_lse, ref)

    results = {"out": (out, ref_out), "lse": (lse, ref_lse)}
    for name, g, rg in zip(inputs, grads, ref_grads):
        assert g is not None, f"d{name}: no gradient reached {name}"
        results[f"d{name}"] = (g, rg)

    if dtype in (torch.float16, torch.bfloat16):
        # SPEC §13: <= 2 x the error of a naive same-dtype implementation + 1e-4.
        naive = prepared(dtype, device, stats_dtype)
        naive_out, naive_lse = run_reference(**naive)
        naive_grads = gradients(naive_out, naive_lse, naive)
        naive_results = {"out": naive_out, "lse": naive_lse}
        naive_results.update({f"d{n}": g for n, g in zip(inputs, naive_grads)})
        for name, (x, r) in results.items():
            bound = 2 * rel_error(naive_results[name], r) + 1e-4
            assert_close(name, x, r, bound)
    else:
        for name, (x, r) in results.items():
            assert_close(name, x, r, tolerance(dtype, allow_tf32))


def randn(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64) * scale


def gradcheck(fn: Callable, inputs: tuple, **kwargs) -> None:
    """torch.autograd.gradcheck of every output with respect to every input. -inf entries of an
    lse (rows with no visible key) are replaced by 0: finite differences of -inf are NaN."""

    def finite_outputs(*xs):
        return tuple(_finite(y) for y in fn(*xs))

    assert torch.autograd.gradcheck(finite_outputs, inputs, eps=1e-6, atol=1e-6, rtol=1e-5, **kwargs)


def infinite_rows(lse: torch.Tensor) -> int:
    return int((lse == -math.inf).sum())
