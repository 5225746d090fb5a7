"""Runs a suite: for every case, every implementation is checked against the reference, then timed.

One record per (case, implementation, direction). A record's status is "ok" (timed), "n/a" (the
implementation cannot run the case: unsupported option, not implemented yet, out of memory) or
"fail" (fmha raised an unexpected error). A failed correctness check keeps the timing but sets
check_ok False, which the reports flag.
"""
from __future__ import annotations

import dataclasses
import sys
import warnings

import torch

from . import flops
from .cases import Case
from .impls import Impl, NotAvailable, Prepared
from .reference import (TORCH_DTYPES, grad_names, make_inputs, materialized_attention,
                        relative_error)
from .timing import Timer

# Largest allowed norm-wise relative error against the fp32 (CUDA) / fp64 (CPU) reference, for the
# output and every gradient. fp16 / bf16 follow SPEC §13 whenever the naive peer ran on the case:
# 2 x the naive same-dtype error of the same tensor + 1e-4; otherwise (scores too large to
# materialise) these fixed bounds, a few times that error at the suites' sizes, apply. fp32 is
# SPEC §13's exact-mode bound itself: the fp32 reference's own error is about 1e-6 at these sizes.
TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 3e-2}
SPEC_FLOOR = 1e-4
REFERENCE_CHUNK_BYTES = 256 << 20


@dataclasses.dataclass
class RunSettings:
    device: str
    check: bool = True
    input_sets: int = 1  # rotated between timed runs
    seed: int = 0


class Progress:
    """tqdm when installed, else a one-line bar on stderr."""

    def __init__(self, total: int, desc: str):
        self.total, self.count, self.desc = total, 0, desc
        try:
            from tqdm import tqdm
            self._bar = tqdm(total=total, desc=desc, unit="run", dynamic_ncols=True)
        except ImportError:
            self._bar = None

    def step(self, label: str):
        self.count += 1
        if self._bar is not None:
            self._bar.set_postfix_str(label[:48])
            self._bar.update(1)
            return
        width = 30
        done = width * self.count // max(self.total, 1)
        sys.stderr.write(f"\r{self.desc} [{'#' * done}{'.' * (width - done)}] "
                         f"{self.count}/{self.total} {label[:48]:<48}")
        sys.stderr.flush()

    def close(self):
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(e).__name__}: {first}"[:240]


def _reason(e: BaseException, caught: list) -> str:
    """Why a call failed: the exception, plus the first warning (SDPA explains refusals there)."""
    reason = _short(e)
    for w in caught:
        message = str(w.message).strip().splitlines()
        if message:
            return f"{reason} ({message[0][:200]})"
    return reason


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def checks_gradients(case: Case) -> bool:
    """Whether any timed direction of the case has a backward (else only the output is checked)."""
    return any(d != "fwd" for d in case.directions)


def reference_outputs(case: Case, t: dict, device: str) -> dict:
    """Output and gradients in fp32 (CUDA) / fp64 (CPU), query rows chunked and recomputed. A
    forward-only case gets the output alone, one sequence at a time (a decode case's cache in
    fp32 would not fit beside the cache itself)."""
    dtype = torch.float64 if device == "cpu" else torch.float32
    if not checks_gradients(case):
        with torch.no_grad():
            outs = [materialized_attention(case, {n: x[b:b + 1] if n in ("q", "k", "v") else x
                                                  for n, x in t.items()},
                                           compute_dtype=dtype) for b in range(t["q"].shape[0])]
        return {"out": torch.cat(outs)}
    leaves = {n: t[n].detach().to(dtype).requires_grad_() for n in grad_names(case)}
    inputs = dict(t, **leaves)
    row_bytes = case.B * case.H * case.Lk * dtype.itemsize * 4
    chunk = max(1, REFERENCE_CHUNK_BYTES // row_bytes)
    with torch.enable_grad():
        out = materialized_attention(case, inputs, compute_dtype=dtype, row_chunk=chunk,
                                     recompute=True)
        grads = torch.autograd.grad(out, list(leaves.values()), t["dout"].to(dtype))
    ref = {"out": out.detach()}
    ref.update({n: g for n, g in zip(leaves, grads)})
    return ref


def _record(case: Case, impl: Impl, direction: str, **fields) -> dict:
    rec = {"case": case.name, "impl": impl.name, "is_peer": impl.is_peer, "direction": direction,
           "status": "ok", "reason": "", "params": case.describe(), "group": case.group,
           "seq_len": case.seq_len or case.Lq, "flops": flops.direction_flops(case, direction)}
    if case.kind == "decode":
        rec["bytes"] = flops.bytes_moved(case, TORCH_DTYPES[case.dtype].itemsize)
    rec.update(fields)
    return rec


def apply_tolerances(case: Case, records: list) -> None:
    """Sets check_error / check_tensor / check_tolerance / check_ok on every checked record of a
    case: the tensor reported is the one closest to (or furthest over) its tolerance."""
    naive = next((r["check_errors"] for r in records
                  if r["impl"] == "naive" and r.get("check_errors")), None)
    for r in records:
        errors = r.get("check_errors")
        if not errors:
            continue

        def tolerance(name):
            if case.dtype in ("fp16", "bf16") and naive and name in naive:
                return 2.0 * naive[name] + SPEC_FLOOR
            return TOLERANCE.get(case.dtype, 1e-2)
        name = max(errors, key=lambda n: errors[n] / tolerance(n))
        r.update(check_error=errors[name], check_tensor=name, check_tolerance=tolerance(name),
                 check_ok=all(errors[n] <= tolerance(n) for n in errors))


class CaseRunner:
    def __init__(self, settings: RunSettings, timer: Timer):
        self.settings = settings
        self.timer = timer

    def _prepare_all(self, impl, case, input_sets):
        return [impl.prepare(case, t) for t in input_sets]

    def _check_run(self, p: Prepared, ref, gradients: bool = True) -> tuple:
        """Untimed forward, then forward + backward (also the first warm-up): errors by name.
        gradients=False (a forward-only case) skips the second.

        Returns (errors, backward_error): backward_error is the exception that stopped the
        differentiable forward or the backward, or None; a failing plain forward propagates."""
        errors = {}
        with torch.no_grad():
            out = p.run(grad=False)
        if ref is not None:
            errors["out"] = relative_error(p.to_common("out", out), ref["out"])
        del out
        if not gradients:
            return errors, None
        try:
            with torch.enable_grad():
                out = p.run(grad=True)
            grads = torch.autograd.grad(out, list(p.leaves.values()), p.dout)
        except Exception as e:  # e.g. a backward kernel not landed yet, or a peer without one
            return errors, e
        if ref is not None:
            for name, g in zip(p.leaves, grads):
                errors["d" + name] = relative_error(p.to_common(name, g), ref[name])
        return errors, None

    def _time(self, direction: str, prepared: list) -> dict:
        n = len(prepared)
        if direction == "fwd":
            def run_once(i):
                with torch.no_grad():
                    return prepared[i % n].run(grad=False)
            return self.timer.measure(run_once)
        if direction == "bwd":
            with torch.enable_grad():
                outs = [p.run(grad=True) for p in prepared]

            def run_once(i):
                p = prepared[i % n]
                return torch.autograd.grad(outs[i % n], list(p.leaves.values()), p.dout,
                                           retain_graph=True)
            result = self.timer.measure(run_once)
            del outs
            return result

        def run_once(i):
            p = prepared[i % n]
            with torch.enable_grad():
                out = p.run(grad=True)
            return torch.autograd.grad(out, list(p.leaves.values()), p.dout)
        return self.timer.measure(run_once)

    def run_impl(self, case: Case, impl: Impl, input_sets: list, ref, memory: bool) -> list:
        directions = case.directions

        def all_na(reason, status="n/a"):
            return [_record(case, impl, d, status=status, reason=reason) for d in directions]

        caught = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                prepared = self._prepare_all(impl, case, input_sets)
                errors, bwd_error = self._check_run(prepared[0], ref, checks_gradients(case))
        except NotAvailable as e:
            return all_na(str(e))
        except NotImplementedError as e:
            return all_na(f"not implemented: {_short(e)}")
        except Exception as e:  # a peer refusing a case is n/a; fmha refusing it is a failure
            reason = "out of memory" if _is_oom(e) else _reason(e, caught)
            return all_na(reason, "n/a" if impl.is_peer or _is_oom(e) else "fail")

        records = []
        for direction in directions:
            names = ["out"] if direction == "fwd" else \
                ["d" + n for n in grad_names(case)] + (["out"] if direction == "fwd+bwd" else [])
            fields = {"check_errors": {n: errors[n] for n in names if n in errors}}
            if direction != "fwd" and bwd_error is not None:
                if _is_oom(bwd_error):
                    status, reason = "n/a", "out of memory"
                elif isinstance(bwd_error, NotImplementedError):
                    status, reason = "n/a", f"not implemented: {_short(bwd_error)}"
                else:
                    status = "n/a" if impl.is_peer else "fail"
                    reason = _reason(bwd_error, caught)
                records.append(_record(case, impl, direction, status=status, reason=reason))
                continue
            try:
                if memory:
                    fields.update(self._peak_memory(prepared[0]))
                else:
                    fields.update(self._time(direction, prepared))
                    seconds = fields["median_ms"] * 1e-3
                    fields["tflops"] = flops.direction_flops(case, direction) / seconds / 1e12
                    if case.kind == "decode":
                        fields["tbps"] = flops.bytes_moved(
                            case, TORCH_DTYPES[case.dtype].itemsize) / seconds / 1e12
            except NotAvailable as e:
                records.append(_record(case, impl, direction, status="n/a", reason=str(e)))
                continue
            except NotImplementedError as e:
                records.append(_record(case, impl, direction, status="n/a",
                                       reason=f"not implemented: {_short(e)}"))
                continue
            except Exception as e:
                reason = "out of memory" if _is_oom(e) else _short(e)
                records.append(_record(case, impl, direction, status="n/a" if impl.is_peer
                                       or _is_oom(e) else "fail", reason=reason))
                continue
            if prepared[0].note:
                fields["note"] = prepared[0].note
            records.append(_record(case, impl, direction, **fields))
        return records

    def _peak_memory(self, p: Prepared) -> dict:
        """Peak bytes allocated by one forward + backward beyond what was allocated before it
        (the inputs, dout and the prepared leaves)."""
        if not self.timer.is_cuda:
            raise NotAvailable("peak memory needs the CUDA caching allocator's statistics")
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.enable_grad():
            out = p.run(grad=True)
        grads = torch.autograd.grad(out, list(p.leaves.values()), p.dout)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out, grads
        return {"peak_extra_bytes": int(peak)}

    def run_case(self, case: Case, impls: list, memory: bool, progress: Progress) -> list:
        s = self.settings
        input_sets = [make_inputs(case, s.device, seed=s.seed + 1000 * i)
                      for i in range(s.input_sets)]
        ref = None
        reference_error = ""
        if s.check:
            try:
                ref = reference_outputs(case, input_sets[0], s.device)
            except Exception as e:  # the reference must never stop the run
                reference_error = _short(e)
                print(f"\nfmha.bench: reference for {case.name!r} failed ({reference_error}); "
                      "its fmha rows fail", file=sys.stderr)
        records = []
        for impl in impls:
            progress.step(f"{case.name} | {impl.name}")
            records += self.run_impl(case, impl, input_sets, ref, memory)
            if self.timer.is_cuda:
                torch.cuda.empty_cache()
        apply_tolerances(case, records)
        if reference_error:  # fmha's rows could not be checked: a failed check, not a pass
            for r in records:
                if not r["is_peer"] and r["status"] == "ok":
                    r.update(check_ok=False, reason=f"reference failed: {reference_error}")
        return records


def run_suite(cases: list, impls: list, settings: RunSettings, timer: Timer, memory: bool,
              desc: str) -> list:
    runner = CaseRunner(settings, timer)
    progress = Progress(len(cases) * len(impls), desc)
    records = []
    try:
        for case in cases:
            records += runner.run_case(case, impls, memory, progress)
    finally:
        progress.close()
    return records
