"""The backend that runs calls on CPU tensors (SPEC §18), chosen process-wide: "auto" (the default)
runs the fast CPU backend for what it covers (dense, varlen and neighborhood attention in float32 /
float16 / bfloat16, extra keys included; see docs/api-python.md, Devices) and the float64 reference for
the rest; "reference"
runs every CPU call on the reference. CUDA tensors are not affected."""

from __future__ import annotations

from ._arguments import CPU_BACKENDS as _CPU_BACKENDS

_cpu_backend = "auto"


def set_cpu_backend(backend: str) -> None:
    """Selects the backend of every later call on CPU tensors: "auto" or "reference"."""
    global _cpu_backend
    if not isinstance(backend, str) or backend not in _CPU_BACKENDS:
        raise ValueError(f"fmha: cpu backend {backend!r} is not one of {', '.join(_CPU_BACKENDS)}")
    _cpu_backend = backend


def get_cpu_backend() -> str:
    """The backend calls on CPU tensors run on: "auto" or "reference"."""
    return _cpu_backend
