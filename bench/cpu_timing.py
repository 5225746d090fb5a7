"""What the one-thread CPU timing scripts (cpu_na_time.py, cpu_bias_time.py) share: their common
arguments, the clock (wall, or CPU seconds of the calling thread with one thread, which other
processes on a shared machine do not skew) and the median of timed runs after a warm-up."""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import fmha


def parse_args(doc: str) -> argparse.Namespace:
    """--threads, --reps, --cases, --dtype, --clock; sets torch's thread count (one with
    --clock thread) and seed, and prints the run's settings."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--cases", default=".")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--clock", default="wall", choices=("wall", "thread"))
    args = p.parse_args()
    if args.clock == "thread":
        args.threads = 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    args.torch_dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    print(f"threads {args.threads}, {args.clock} clock, {args.dtype}, torch {torch.__version__}, "
          f"fmha {fmha.__version__}")
    return args


def median_seconds(fn, reps: int, clock: str) -> float:
    """Median of `reps` timed calls of fn() after one untimed call."""
    now = time.thread_time if clock == "thread" else time.perf_counter
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = now()
        fn()
        times.append(now() - start)
    return statistics.median(times)


def print_table_header(peer: str) -> None:
    """The markdown header of the scripts' table, `peer` naming the other implementation."""
    print(f"| case | fmha fwd ms | {peer} fwd ms | fwd ratio | fmha fwd+bwd ms | {peer} fwd+bwd ms | "
          "fwd+bwd ratio | fmha GFLOP/s fwd |")
    print("|---|---|---|---|---|---|---|---|")


def print_row(name: str, times: tuple, flops: float) -> None:
    """A table row from (fwd fmha, fwd peer, fwd+bwd fmha, fwd+bwd peer) seconds."""
    fwd_ours, fwd_peer, both_ours, both_peer = times
    print(f"| {name} | {fwd_ours * 1e3:.2f} | {fwd_peer * 1e3:.2f} | {fwd_peer / fwd_ours:.1f}x | "
          f"{both_ours * 1e3:.2f} | {both_peer * 1e3:.2f} | {both_peer / both_ours:.1f}x | "
          f"{flops / fwd_ours * 1e-9:.0f} |", flush=True)
