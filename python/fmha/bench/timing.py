"""Timing of one callable: warm-up, then many timed runs, reported as median and p10-p90.

CUDA: one pair of CUDA events around every run, the L2 cache flushed (a buffer larger than L2 is
overwritten) before each run so no run reads inputs left in cache by the previous one, and input
sets rotated. CPU: time.perf_counter around every run, input sets rotated.

A run's events time the GPU from its start event to its end event. Where the host takes longer to
issue a call than the GPU takes to run the previous one, the GPU waits for the host inside that
window, and the time includes part of the host's. With queue_us > 0 the GPU first spins that long
after each flush (torch.cuda._sleep), so a call issued within it is queued whole before its start
event: the time is then the GPU's alone. Host time per call: bench/host_overhead.py.
The number of runs adapts to the cost of one run: enough to fill `budget_ms`, within
[min_reps, max_reps].
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import torch


@dataclasses.dataclass
class TimerSettings:
    budget_ms: float = 60.0
    min_reps: int = 10
    max_reps: int = 200
    warmup: int = 2
    queue_us: float = 0.0  # GPU-side wait after each flush (module docstring)


def percentile(values, q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(times_ms) -> dict:
    return {"median_ms": percentile(times_ms, 50), "p10_ms": percentile(times_ms, 10),
            "p90_ms": percentile(times_ms, 90), "reps": len(times_ms)}


class Timer:
    def __init__(self, device: str, settings: TimerSettings):
        self.device = device
        self.settings = settings
        self._flush_buffer = None
        if device.startswith("cuda"):
            props = torch.cuda.get_device_properties(device)
            l2_bytes = getattr(props, "L2_cache_size", 0) or (64 << 20)
            self._flush_buffer = torch.empty(2 * l2_bytes, dtype=torch.int8, device=device)
        self._queue_cycles = 0
        if self._flush_buffer is not None and settings.queue_us > 0:
            self._queue_cycles = int(settings.queue_us * self._spin_cycles_per_us())

    @staticmethod
    def _spin_cycles_per_us() -> float:
        """torch.cuda._sleep's cycles per microsecond on this GPU, from one timed spin."""
        cycles = 2_000_000
        torch.cuda._sleep(cycles)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) * 1e3)

    @property
    def is_cuda(self) -> bool:
        return self._flush_buffer is not None

    def _run_cuda(self, run_once: Callable[[int], object], reps: int) -> list:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            self._flush_buffer.zero_()
            if self._queue_cycles:
                torch.cuda._sleep(self._queue_cycles)
            starts[i].record()
            run_once(i)
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def _run_cpu(self, run_once: Callable[[int], object], reps: int) -> list:
        times = []
        for i in range(reps):
            start = time.perf_counter()
            run_once(i)
            times.append((time.perf_counter() - start) * 1e3)
        return times

    def measure(self, run_once: Callable[[int], object]) -> dict:
        """Times run_once(i) (i selects the rotating input set); returns summarize()'s dict."""
        runner = self._run_cuda if self.is_cuda else self._run_cpu
        s = self.settings
        estimate = runner(run_once, max(s.warmup, 1))  # warm-up, also the cost estimate
        per_run = max(min(estimate[-1:] + [percentile(estimate, 50)]), 1e-3)
        reps = int(min(max(math.ceil(s.budget_ms / per_run), s.min_reps), s.max_reps))
        return summarize(runner(run_once, reps))
