"""The process groups of the fmha.distributed tests (test_distributed.py, test_distributed_varlen.py).

One group of processes per world size and test module runs every case of the module once and
reports per case what the tests then check (errors against single-process fmha, tolerances, or the
traceback of what a case raised). A test module gives CASES (name: spec) and _run_case(spec,
world), _run_refusals(world) and _run_helpers(world), each returning a JSON-able dict. The ranks run on the CPU with gloo, or with
FMHA_DISTRIBUTED_DEVICE=cuda over NCCL, one GPU a rank."""

from __future__ import annotations

import importlib
import json
import math
import multiprocessing
import os
import tempfile
import traceback
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# The ranks' device: "cpu" (gloo) or "cuda" (NCCL, one GPU a rank).
DEVICE = os.environ.get("FMHA_DISTRIBUTED_DEVICE", "cpu")
WORLDS = [2, 4] if DEVICE == "cpu" else [w for w in (2, 4) if w <= torch.cuda.device_count()]

# The test modules' skip marks: torch.distributed with gloo, and on CUDA a GPU with NCCL.
MARKS = [pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                            reason="torch.distributed with gloo")]  # fmt: skip
if DEVICE == "cuda":
    MARKS.append(pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(),
                                    reason="CUDA with NCCL"))  # fmt: skip

# Against single-process fmha on the same inputs. fp32 runs the fast CPU backend; the merge of W
# partial results rounds differently from one call, which stays well within SPEC §13's 1e-5
# against float64 for each. fp64 runs the float64 reference, where only the summation order
# differs. fp16 / bf16 are held to SPEC §13's own rule against the float64 call.
TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-11}
LOW_PRECISION = (torch.bfloat16, torch.float16)


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Norm-wise relative error over the finite entries; inf where the non-finite ones differ
    (-inf lse of fully masked rows must be exact)."""
    x, ref = x.detach().double(), ref.detach().double()
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(x)) or not torch.equal(x[~finite], ref[~finite]):
        return math.inf
    x, ref = x[finite], ref[finite]
    return float((x - ref).norm() / ref.norm().clamp_min(1e-300))


def captured(run, *args) -> dict:
    """run(*args), or the traceback of what it raised: reported to the test, which fails with it."""
    try:
        return run(*args)
    except Exception:  # noqa: BLE001
        return {"exception": traceback.format_exc()}


def _module_report(module: str, world: int) -> dict:
    """One rank's report of test module `module`: its cases, refusals and helper checks, each
    captured."""
    m = importlib.import_module(module)
    report = {name: captured(m._run_case, spec, world) for name, spec in m.CASES.items()}
    report["refusals"] = captured(m._run_refusals, world)
    report["helpers"] = captured(m._run_helpers, world)
    return report


def _worker(rank: int, world: int, store_path: str, report_dir: str, module: str) -> None:
    torch.set_num_threads(1)
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if DEVICE == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                            world_size=world)  # fmt: skip
    result = _module_report(module, world)
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(report_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


_REPORTS: dict = {}


def reports(world: int, module: str) -> list[dict]:
    """Every rank's report of test module `module` from one group of `world` processes (run once
    per world size and module)."""
    key = (module, world)
    if key not in _REPORTS:
        # Processes fork from a server that imported torch and fmha once (a spawned process
        # imports them itself: seconds each on a small machine); the server has run nothing, so
        # no thread pool is forked.
        multiprocessing.set_forkserver_preload(["torch", "fmha", "fmha.distributed"])
        with tempfile.TemporaryDirectory() as tmp:
            store = os.path.join(tmp, "store")
            mp.start_processes(_worker, args=(world, store, tmp, module), nprocs=world,
                               join=True, start_method="forkserver")  # fmt: skip
            _REPORTS[key] = []
            for r in range(world):
                with open(os.path.join(tmp, f"rank{r}.json")) as f:
                    _REPORTS[key].append(json.load(f))
    return _REPORTS[key]


def entries(world: int, name: str, module: str) -> list[tuple[int, dict]]:
    """(rank, its report's entry `name`) for every rank of the group of `world` processes; fails
    with the rank's traceback where the entry raised."""
    found = []
    for rank, result in enumerate(reports(world, module)):
        entry = result[name]
        assert "exception" not in entry, f"rank {rank}:\n{entry.get('exception')}"
        found.append((rank, entry))
    return found


def check_case(world: int, case: str, module: str, results: set) -> None:
    """Every rank's entry `case`: skipped as the rank says, or every error of `results` (and any
    other it reports) within its tolerance."""
    for rank, result in entries(world, case, module):
        if "skipped" in result:
            pytest.skip(result["skipped"])
        errors = result["errors"]
        assert results <= errors.keys()
        bad = {k: (e, result["tolerance"][k]) for k, e in errors.items()
               if not e <= result["tolerance"][k]}  # fmt: skip
        assert not bad, f"rank {rank}: (relative error, tolerance) of the failing results: {bad}"


def check_all_true(world: int, name: str, module: str, at_least: int) -> None:
    """Every rank's entry `name`, a dict of named checks: more than `at_least` of them, all True."""
    for rank, checks in entries(world, name, module):
        assert len(checks) > at_least
        failed = [check for check, ok in checks.items() if ok is not True]
        assert not failed, f"rank {rank}: {failed}"
