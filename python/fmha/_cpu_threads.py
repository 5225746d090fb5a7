"""The fast CPU backend's workers on PyTorch's OpenMP team (fmha::set_cpu_parallel_runtime).

PyTorch's OpenMP threads spin for a while after each of its parallel operations; fmha's own worker
threads then compete with them for the cores (on a 2-core machine a small call right after PyTorch
operations ran at one thread's speed). Handing fmha's workers to the same team makes those spinning
threads the workers. Done once, when the PyTorch front end is imported, for the OpenMP runtime
already loaded in the process (libgomp, or LLVM's / Intel's, which provide the same two entry
points); elsewhere, or with FMHA_CPU_OWN_THREADS=1, fmha keeps its own threads."""

from __future__ import annotations

import ctypes
import os
import re

from . import _C

_RUNTIMES = re.compile(r"\S*/lib(?:gomp|iomp5|omp)[\w.-]*\.so[\w.-]*")


def _loaded_openmp() -> str | None:
    """The path of an OpenMP runtime mapped into this process (Linux), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            found = _RUNTIMES.search(maps.read())
    except OSError:
        return None
    return found.group(0) if found else None


def use_torch_openmp() -> bool:
    """Hands the CPU backend's workers to the OpenMP team of the process (PyTorch's, imported by
    now); True when one was found and taken."""
    if os.environ.get("FMHA_CPU_OWN_THREADS", "") not in ("", "0"):
        return False
    path = _loaded_openmp()
    if path is None:
        return False
    try:
        runtime = ctypes.CDLL(path)  # already loaded: the same library, not a second copy
        parallel = ctypes.cast(runtime.GOMP_parallel, ctypes.c_void_p).value
        thread_num = ctypes.cast(runtime.omp_get_thread_num, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return False
    if not parallel or not thread_num:
        return False
    _C.set_cpu_parallel_runtime(parallel, thread_num)
    return True
