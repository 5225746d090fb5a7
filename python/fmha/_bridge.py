"""Crossing from torch tensors to the C++ API (fmha._C) and back.

Tensors cross as views: address, dtype, device, shape and strides in elements (fmha::TensorView);
nothing is copied here. A Status that is not ok becomes a Python exception carrying the C++
message unchanged (SPEC §14):

    invalid_argument  -> TypeError when the message is about a dtype, ValueError otherwise
    not_supported     -> NotImplementedError (valid input that this backend cannot run)
    backend_error     -> RuntimeError
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import _C

_DTYPES = {
    torch.float32: _C.DType.float32,
    torch.float16: _C.DType.float16,
    torch.bfloat16: _C.DType.bfloat16,
    torch.float64: _C.DType.float64,
    torch.int32: _C.DType.int32,
}
_DEVICES = {"cpu": _C.DeviceType.cpu, "cuda": _C.DeviceType.cuda}
_MAX_RANK = 6

# check() validates without touching memory, so a view that only describes an output still to be
# allocated (or a fake tensor traced by torch.compile) gets this address: non-null and aligned,
# never dereferenced.
_PLANNED_ADDRESS = 1 << 12


def raise_for_status(status: _C.Status) -> None:
    if status.ok:
        return
    message = status.message
    if status.code == _C.StatusCode.invalid_argument:
        raise (TypeError if "dtype" in message else ValueError)(message)
    if status.code == _C.StatusCode.not_supported:
        raise NotImplementedError(message)
    raise RuntimeError(message)


def _dtype_of(dtype: torch.dtype, name: str) -> _C.DType:
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError(
            f"fmha: {name} has dtype {dtype}; accepted: float32, float16, bfloat16 "
            "(float64 on the CPU backend), int32 for cu_seqlens"
        ) from None


def _device_of(device: torch.device, name: str) -> _C.DeviceType:
    try:
        return _DEVICES[device.type]
    except KeyError:
        raise ValueError(f"fmha: {name} is on device {device}; accepted: cpu, cuda") from None


def describe(
    shape: Sequence[int],
    stride: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    name: str,
    address: int = _PLANNED_ADDRESS,
) -> _C.TensorView:
    """A view of a tensor given by its metadata; `address` defaults to the planned placeholder."""
    if not 1 <= len(shape) <= _MAX_RANK:
        raise ValueError(
            f"fmha: {name} has {len(shape)} dimensions; fmha tensors have 1 to {_MAX_RANK}"
        )
    return _C.TensorView(
        address,
        _dtype_of(dtype, name),
        _device_of(device, name),
        device.index or 0,
        shape,  # plain ints: check() runs on fake tensors only when no size is symbolic
        stride,
    )


# (DType, DeviceType, device index) of the dtypes (CPU) and (dtype, index) pairs (CUDA) seen so
# far, so that a view costs one dictionary look-up for them (hashing a torch.device would cost
# more); a dtype or device that is refused is never stored.
_CPU_KINDS: dict = {}
_CUDA_KINDS: dict = {}


def _kind(t: torch.Tensor, name: str) -> tuple:
    """(DType, DeviceType, device index) of t, or the error that names what is refused."""
    if t.is_cpu:
        kind = _CPU_KINDS.get(t.dtype)
    elif t.is_cuda:
        kind = _CUDA_KINDS.get((t.dtype, t.get_device()))
    else:
        kind = None
    if kind is None:
        device = t.device
        kind = (_dtype_of(t.dtype, name), _device_of(device, name), device.index or 0)
        if device.type == "cpu":
            _CPU_KINDS[t.dtype] = kind
        else:
            _CUDA_KINDS[(t.dtype, device.index)] = kind
    return kind


def view(
    t: Optional[torch.Tensor], name: str, *, planned: bool = False, broadcast: bool = False
) -> _C.TensorView:
    """The TensorView of `t` (not given when t is None). planned=True describes t without reading
    its address, for check() on outputs not yet allocated and on fake tensors. broadcast=True
    (bias, rel-pos and their gradients) gives dimensions of size 1 stride 0: the same elements,
    spelled the way every backend reads as broadcast. describe() spelled out for the hot path:
    the shape as a tuple (nanobind converts a torch.Size element by element, twice as slow)."""
    if t is None:
        return _C.TensorView()
    shape = tuple(t.shape)
    if not 1 <= len(shape) <= _MAX_RANK:
        raise ValueError(
            f"fmha: {name} has {len(shape)} dimensions; fmha tensors have 1 to {_MAX_RANK}"
        )
    stride = t.stride()
    if broadcast:
        stride = [0 if size == 1 else st for size, st in zip(shape, stride)]
    kind = _kind(t, name)
    address = _PLANNED_ADDRESS if planned else t.data_ptr()
    return _C.TensorView(address, *kind, shape, stride)


def planned_contiguous(
    shape: Sequence[int], dtype: torch.dtype, device: torch.device, name: str
) -> _C.TensorView:
    """The view a torch.empty(shape) output will have, before it exists."""
    stride, running = [], 1
    for size in reversed(shape):
        stride.append(running)
        running *= max(int(size), 1)
    return describe(shape, stride[::-1], dtype, device, name)


def is_static(*tensors: Optional[torch.Tensor]) -> bool:
    """True when every size and stride is a plain int (not symbolic, as under dynamic shapes), so
    the C++ check can run on the metadata alone without specialising the traced graph."""
    for t in tensors:
        if t is None:
            continue
        if t.device.type == "meta":
            return False
        if not all(isinstance(s, int) for s in (*t.shape, *t.stride())):
            return False
    return True


def check_devices(*named: tuple[str, Optional[torch.Tensor]]) -> None:
    """Every given tensor on the first one's device. The C++ check says the same of any call it
    sees; this covers the calls it does not see: meta tensors (which only describe shapes, and are
    not a device the C++ layer knows) and shapes that are symbolic while torch.compile traces.
    Without it a meta tensor among real ones would take the shape-only path and pass."""
    first_name, first = named[0]
    for name, t in named[1:]:
        if t is not None and t.device != first.device:
            raise ValueError(
                f"fmha: {name} is on {t.device} but {first_name} is on {first.device}; every "
                f"tensor must be on {first_name}'s device"
            )


def _current_raw_stream(index: int) -> int:
    """torch's current CUDA stream of device `index`, as the address the C++ API takes."""
    return torch.cuda.current_stream(index).cuda_stream


# torch's own one-call form of the above (what torch.compile's generated code calls): no Stream
# object made per call. A torch without it takes the public form.
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _current_raw_stream)


def run(params, device: torch.device) -> None:
    """Runs params on its device: CPU tensors on the CPU backend; CUDA tensors on torch's current
    stream of their device, so the work orders with the surrounding torch kernels (the C++ entry
    makes the tensors' device current for the call itself)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        status = _C.run(params, _current_raw_stream(index))
    else:
        status = _C.run(params, 0)
    raise_for_status(status)


# torch.empty of n bytes on CUDA device `index`, one function a device, made on first use.
_SCRATCH_ALLOCATORS: dict = {}


def _scratch_allocator(index: int):
    allocate = _SCRATCH_ALLOCATORS.get(index)
    if allocate is None:
        device = torch.device("cuda", index)

        def allocate(nbytes: int) -> torch.Tensor:
            return torch.empty(nbytes, dtype=torch.uint8, device=device)

        _SCRATCH_ALLOCATORS[index] = allocate
    return allocate


def run_shaped(params, device: torch.device) -> None:
    """run() for the attention entry points (dense, varlen, neighborhood), whose scratch memory on
    CUDA (the backward's fp32 statistics and accumulators, the fp32 kernels' operand planes, a
    masked forward's tile counter) comes from PyTorch's caching allocator: a uint8 tensor on the
    current stream, asked for by the C++ call with the bytes it needs and released when it returns
    (stream-ordered, as any tensor freed after its kernels are queued). So it shows in
    torch.cuda.memory_allocated, and under CUDA graph capture it comes from the graph's pool."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        status = _C.run_allocating(
            params, _current_raw_stream(index), _scratch_allocator(index)
        )
    else:
        status = _C.run(params, 0)
    raise_for_status(status)


def check(params) -> None:
    raise_for_status(_C.check(params))
