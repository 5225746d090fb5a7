"""python -m fmha.bench: time fmha against every attention implementation available here.

  python -m fmha.bench --suite quick                 # ~1 minute, GPU if present, else CPU
  python -m fmha.bench --suite standard --out DIR    # dense grid, TFLOP/s plots
  python -m fmha.bench --suite memory                # peak memory of fwd+bwd vs sequence length

  python -m fmha.bench --suite decode                # decode over a KV cache, contiguous and paged

Suites: standard, features, na, memory, quick, decode (see cases.py). Results go to
bench/results/<device-name>/<suite>.{json,md,png} unless --out says otherwise.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import re
import shlex
import sys

import torch

from . import report
from .cases import DIRECTIONS, SUITES, is_decode_suite, is_memory_suite, suite_cases
from .impls import Settings, all_impls, decode_impls
from .runner import RunSettings, run_suite
from .timing import Timer, TimerSettings


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            found = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.MULTILINE)
            if found:
                name = found.group(1)
    except OSError:
        pass
    return f"CPU {name.strip()}".strip()


def fits_memory(case, fraction: float) -> bool:
    """Whether a decode case's K + V fit in `fraction` of the current GPU's memory."""
    from .flops import bytes_moved
    from .reference import TORCH_DTYPES

    cache = bytes_moved(case, TORCH_DTYPES[case.dtype].itemsize)
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return cache <= fraction * total


def copy_bandwidth_tbps(device: str) -> float:
    """TB/s of a 1 GiB device-to-device copy (bytes read + written, median of 20 by CUDA events):
    the card's practical bandwidth, which decode rates are read against."""
    from .timing import percentile

    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / (percentile(times, 50) * 1e-3) / 1e12


def fmha_version() -> str:
    try:
        import fmha
    except ImportError as e:
        return f"not importable ({e})"
    return getattr(fmha, "__version__", "unknown")


def fmha_cpu_isa() -> str:
    """The instruction set of fmha's CPU kernels here (a CPU run's report records it)."""
    try:
        from fmha import _C
    except ImportError as e:
        return f"not importable ({e})"
    return _C.cpu_isa()


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m fmha.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=SUITES, default="quick")
    p.add_argument("--device", choices=("cuda", "cpu"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", help="output folder (default bench/results/<device-name>)")
    p.add_argument("--impls", help="comma-separated implementations to run "
                                   "(fmha, sdpa-flash, sdpa-efficient, sdpa-cudnn, sdpa-math, flex, "
                                   "naive); default all. With --backward-impl both, fmha "
                                   "selects fmha-fused and fmha-split")
    p.add_argument("--backward-impl", choices=("auto", "fused", "split", "both"), default="auto",
                   help="the backward_impl argument of fmha's functions. auto (default), fused "
                        "or split: one implementation, named fmha, run with that choice. both: "
                        "fmha-fused and fmha-split, timed in the same process on the same inputs "
                        "as the peers (their forward rows time the same forward twice); each row "
                        "keeps its own 'vs best peer' ratio, the summary has one line per fmha "
                        "implementation and the exit status covers both")
    p.add_argument("--page-sizes", default="16,64,256",
                   help="decode suite: page sizes of the paged caches fmha is timed on, besides "
                        "the contiguous cache (default 16,64,256)")
    p.add_argument("--max-cache-fraction", type=float, default=0.3,
                   help="decode suite on CUDA: cases whose K + V take more than this fraction of "
                        "the GPU's memory are skipped (a paged copy and SDPA's contiguous copy "
                        "sit beside the cache; default 0.3)")
    p.add_argument("--cases", help="regular expression selecting case names")
    p.add_argument("--directions", default=",".join(DIRECTIONS),
                   help="comma-separated subset of fwd,bwd,fwd+bwd")
    p.add_argument("--budget-ms", type=float, help="timed milliseconds per measurement")
    p.add_argument("--min-reps", type=int)
    p.add_argument("--max-reps", type=int)
    p.add_argument("--queue-us", type=float, default=0.0,
                   help="CUDA: the GPU spins this long after each L2 flush, so that a call the "
                        "host issues within it is queued whole before its start event and the "
                        "time is the GPU's alone (default 0: the time includes any wait for the "
                        "host; host time per call: bench/host_overhead.py)")
    p.add_argument("--input-sets", type=int,
                   help="input sets rotated between runs (default 1 on CUDA, which flushes L2 "
                        "before every run instead; 2 on CPU)")
    p.add_argument("--materialize-limit-gib", type=float,
                   help="largest fp32 score matrix naive / sdpa-math may build "
                        "(default 1/16 of GPU memory; 0.25 on CPU)")
    p.add_argument("--flex-cpu", action="store_true", help="also compile FlexAttention on CPU")
    p.add_argument("--flex-dynamic", choices=("auto", "on", "off"), default="off",
                   help="torch.compile(dynamic=...) for flex_attention. off (default): one "
                        "kernel specialised to each case's shapes, as a user with fixed shapes "
                        "gets; auto recompiles with symbolic shapes after the first shape change, "
                        "which made later cases of a suite slower (H100, 2026-11-23: NA1d D128 "
                        "forward 333 -> 285 TFLOP/s in a longer suite)")
    p.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build(args):
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("fmha.bench: --device cuda but torch.cuda.is_available() is False")
    device = "cuda" if cuda else "cpu"
    if args.materialize_limit_gib is not None:
        limit = int(args.materialize_limit_gib * 2**30)
    elif cuda:
        limit = torch.cuda.get_device_properties(device).total_memory // 16
    else:
        limit = 2**28
    settings = Settings(device=device, materialize_limit_bytes=limit, flex_on_cpu=args.flex_cpu,
                        flex_dynamic={"auto": None, "on": True, "off": False}[args.flex_dynamic],
                        backward_impl=args.backward_impl)
    if is_decode_suite(args.suite):
        impls = decode_impls(settings, tuple(int(x) for x in args.page_sizes.split(",") if x))
    else:
        impls = all_impls(settings)
    if args.impls:
        wanted = [s.strip() for s in args.impls.split(",") if s.strip()]
        unknown = set(wanted) - {i.name for i in impls} - {"fmha"}
        if unknown:
            sys.exit(f"fmha.bench: unknown --impls {sorted(unknown)}; "
                     f"available: {', '.join(i.name for i in impls)}")
        impls = [i for i in impls if i.name in wanted or (not i.is_peer and "fmha" in wanted)]
    timer_settings = TimerSettings(budget_ms=40.0, min_reps=10, max_reps=100, warmup=2) if cuda \
        else TimerSettings(budget_ms=100.0, min_reps=5, max_reps=20, warmup=1)
    for field in ("budget_ms", "min_reps", "max_reps"):
        if getattr(args, field) is not None:
            setattr(timer_settings, field, getattr(args, field))
    if cuda:
        timer_settings.queue_us = args.queue_us
    run_settings = RunSettings(device=device, check=not args.no_check, seed=args.seed,
                               input_sets=args.input_sets or (1 if cuda else 2))
    directions = tuple(d for d in DIRECTIONS if d in args.directions.split(","))
    cases = []
    for case in suite_cases(args.suite, device):
        if args.cases and not re.search(args.cases, case.name):
            continue
        if cuda and case.kind == "decode" and not fits_memory(case, args.max_cache_fraction):
            print(f"fmha.bench: {case.name} skipped: its K + V take more than "
                  f"{args.max_cache_fraction:g} of the GPU's memory", file=sys.stderr)
            continue
        kept = tuple(d for d in case.directions if d in directions)
        if kept:
            cases.append(dataclasses.replace(case, directions=kept))
    return device, impls, timer_settings, run_settings, cases


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device, impls, timer_settings, run_settings, cases = build(args)
    # Exact fp32 everywhere: the reference and fp32 peers must not silently use TF32.
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    name = device_name(device)
    out_dir = args.out or os.path.join("bench", "results", report.slug(name))
    os.makedirs(out_dir, exist_ok=True)
    memory = is_memory_suite(args.suite)
    timer = Timer(device, timer_settings)
    checked_gradients = "" if is_decode_suite(args.suite) else " and every gradient"
    meta = {
        "suite": args.suite, "device": device, "device_name": name,
        "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
        "fmha_version": fmha_version(), "python_version": platform.python_version(),
        **({"fmha_cpu_isa": fmha_cpu_isa()} if device == "cpu" else {}),
        "command": "python -m fmha.bench " + " ".join(shlex.quote(a) for a in
                                                      (sys.argv[1:] if argv is None else argv)),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "timing": (f"{'CUDA events, L2 flushed before every run' if timer.is_cuda else 'perf_counter'}"
                   + (f", the GPU spinning {timer_settings.queue_us:g} us after each flush (calls "
                      "queued whole: GPU time alone)" if timer_settings.queue_us > 0 else "")
                   + f", {timer_settings.warmup} warm-up runs, median and p10-p90 of "
                   f"{timer_settings.min_reps}..{timer_settings.max_reps} runs filling "
                   f"{timer_settings.budget_ms:g} ms, {run_settings.input_sets} rotating input "
                   "set(s), random normal inputs"),
        "flex": "torch.compile(flex_attention, dynamic="
                f"{ {'auto': None, 'on': True, 'off': False}[args.flex_dynamic]})",
        "check": ("off" if not run_settings.check else
                  f"norm-wise relative error of out{checked_gradients} against a "
                  f"{'fp64' if device == 'cpu' else 'fp32'} materialised reference; tolerance "
                  "fp32 1e-5, fp16/bf16 2 x the naive peer's error + 1e-4 (SPEC §13) or, "
                  "without naive, 1e-2 / 3e-2"),
        "flops": report.FLOP_CONVENTION,
        "cases": len(cases), "impls": [i.name for i in impls],
        "backward_impl": args.backward_impl,
    }
    print(f"fmha.bench: {args.suite} suite, {len(cases)} cases x {len(impls)} implementations on "
          f"{name} (torch {torch.__version__}, fmha {meta['fmha_version']})", file=sys.stderr)
    if is_decode_suite(args.suite):
        meta["bytes"] = report.BYTES_CONVENTION
        if device == "cuda":
            meta["copy_bandwidth_tbps"] = copy_bandwidth_tbps(device)
    records = run_suite(cases, impls, run_settings, timer, memory, desc=args.suite)
    report.add_ratios(records, meta.get("copy_bandwidth_tbps"))
    summary = report.format_summary(records, memory)
    print(report.format_table(records, memory))
    base = os.path.join(out_dir, args.suite)
    report.write_json(base + ".json", meta, records)
    with open(os.path.join(out_dir, "summary.txt"), "w") as f:
        f.write(f"fmha.bench {args.suite} on {name}\n{summary}\n")
    plots = [] if args.no_plots else report.write_plots(out_dir, args.suite, meta, records, memory)
    report.write_markdown(base + ".md", meta, records, memory, plots)
    # The exit status speaks for fmha; a peer over its tolerance is flagged in the table only.
    failed = [r for r in records if not r["is_peer"]
              and (r["status"] == "fail" or r.get("check_ok") is False)]
    print(f"\n== summary: fmha against the best peer ({name})\n{summary}")
    print(f"\nwrote {base}.json, {base}.md, {out_dir}/summary.txt"
          + "".join(f", {p}" for p in plots))
    if failed:
        print(f"{len(failed)} fmha row(s) failed (status fail or check above tolerance)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
