"""Tests of the benchmark machinery (python -m fmha.bench): exact FLOP counts, masks, a tiny run."""
import json
import os

import pytest
import torch

from fmha.bench import cases, flops, masks
from fmha.bench.__main__ import main
from fmha.bench.runner import apply_tolerances


def _brute_pairs(case):
    q = torch.arange(case.Lq)[:, None]
    k = torch.arange(case.Lk)[None, :]
    return int(masks.visible(case, q, k).sum())


@pytest.mark.parametrize("L,Lk,causal,window", [
    (1, 1, False, None), (17, 17, True, None), (113, 113, False, (5, 0)), (127, 127, True, (7, 3)),
    (64, 64, False, (0, 0)), (100, 100, False, (-1, 9)), (239, 239, True, (300, -1)),
    (40, 57, False, (3, 11)), (57, 40, True, None),
])
def test_dense_flops_count_visible_pairs_exactly(L, Lk, causal, window):
    case = cases.dense("t", B=2, H=3, L=L, Lk=Lk, D=8, causal=causal, window=window)
    assert flops.visible_pairs(case) == 2 * 3 * _brute_pairs(case)
    assert flops.forward_flops(case) == 2 * flops.visible_pairs(case) * (8 + 8)
    assert flops.direction_flops(case, "bwd") == 2.5 * flops.forward_flops(case)
    assert flops.direction_flops(case, "fwd+bwd") == 3.5 * flops.forward_flops(case)


def _spec_axis_neighbors(x, length, kernel, dilation, causal):
    """SPEC §6 on one axis, scalar and literal: the key coordinates visible to query x."""
    g, p = x % dilation, x // dilation
    n = -(-(length - g) // dilation)
    if causal:
        ts = range(max(p - kernel + 1, 0), p + 1)
    else:
        start = min(max(p - kernel // 2, 0), n - kernel)
        ts = range(start, start + kernel)
    return {g + dilation * t for t in ts}


@pytest.mark.parametrize("grid,kernel,dilation,causal", [
    ((33,), (7,), (1,), (False,)), ((33,), (5,), (3,), (False,)), ((30,), (4,), (2,), (True,)),
    ((9, 11), (3, 5), (2, 1), (False, True)), ((6, 7, 5), (3, 3, 3), (1, 2, 1), (True, False, False)),
    ((16,), (16,), (1,), (False,)), ((12, 8), (2, 4), (3, 2), (False, False)),
])
def test_na_mask_matches_spec_and_flops(grid, kernel, dilation, causal):
    case = cases.na("t", B=1, H=2, grid=grid, kernel=kernel, dilation=dilation, causal=causal, D=4)
    L = case.Lq
    vis = masks.visible(case, torch.arange(L)[:, None], torch.arange(L)[None, :])
    coords = list(torch.cartesian_prod(*[torch.arange(x) for x in grid]).reshape(L, -1).tolist())
    for qi in range(0, L, max(1, L // 23)):  # a spread of query tokens, every key
        allowed = [_spec_axis_neighbors(coords[qi][a], grid[a], kernel[a], dilation[a], causal[a])
                   for a in range(len(grid))]
        expected = [all(coords[kj][a] in allowed[a] for a in range(len(grid))) for kj in range(L)]
        assert vis[qi].tolist() == expected, f"query {coords[qi]}"
    assert flops.visible_pairs(case) == 2 * int(vis.sum())


def test_varlen_flops_sum_over_sequences():
    case = cases.varlen("t", seqlens=(5, 17, 1, 40), H=2, D=8, causal=True)
    expected = sum(n * (n + 1) // 2 for n in case.seqlens) * 2
    assert flops.visible_pairs(case) == expected


def test_quick_cpu_run_writes_json_and_markdown(tmp_path):
    out = tmp_path / "results"
    rc = main(["--suite", "quick", "--device", "cpu", "--out", str(out), "--impls",
               "fmha,sdpa-math,naive", "--cases", "^D32 L128$|NA2d", "--budget-ms", "1",
               "--min-reps", "2", "--max-reps", "2"])
    data = json.loads((out / "quick.json").read_text())
    assert data["meta"]["suite"] == "quick" and data["meta"]["device"] == "cpu"
    assert data["meta"]["fmha_cpu_isa"] in ("avx512bf16", "avx512", "avx2", "portable")
    records = data["records"]
    assert {r["impl"] for r in records} == {"fmha", "sdpa-math", "naive"}
    assert {r["case"] for r in records} == {"D32 L128", "NA2d 12x12 K5x5 D32"}
    for r in records:
        assert r["status"] in ("ok", "n/a", "fail")
        if r["status"] == "ok":
            assert r["median_ms"] > 0 and r["tflops"] > 0 and r["reps"] == 2
            assert r["p10_ms"] <= r["median_ms"] <= r["p90_ms"]
            # fmha and the peers compute the same function: every check must pass
            assert r["check_ok"], r
    assert all(r["status"] == "ok" for r in records if not r["is_peer"]), records
    peers_timed = [r for r in records if r["is_peer"] and r["status"] == "ok"]
    assert len(peers_timed) == 2 * 2 * 3  # 2 peers x 2 cases x 3 directions
    assert all(r.get("vs_best_peer") for r in peers_timed)
    assert rc == 0
    markdown = (out / "quick.md").read_text()
    assert "torch version" in markdown and "| case | impl | dir |" in markdown
    assert f"- **fmha cpu isa**: {data['meta']['fmha_cpu_isa']}" in markdown
    assert "D32 L128" in markdown
    if any(os.path.exists(out / f"quick_{d}.png") for d in ("fwd", "bwd", "fwd-bwd")):
        assert os.path.getsize(out / "quick_fwd.png") > 0


def test_a_failed_reference_fails_the_run(tmp_path, monkeypatch):
    # Rows that could not be checked are failures, not passes: the run's exit status says so.
    from fmha.bench import runner

    def broken_reference(*args, **kwargs):
        raise RuntimeError("reference out of memory")

    monkeypatch.setattr(runner, "reference_outputs", broken_reference)
    out = tmp_path / "results"
    rc = main(["--suite", "quick", "--device", "cpu", "--out", str(out), "--impls", "fmha",
               "--cases", "^D32 L128$", "--directions", "fwd", "--budget-ms", "1",
               "--min-reps", "1", "--max-reps", "1", "--no-plots"])
    records = json.loads((out / "quick.json").read_text())["records"]
    assert rc == 1
    assert records and all(r["check_ok"] is False and "reference failed" in r["reason"]
                           for r in records if not r["is_peer"])


def test_tolerance_follows_spec_rule_when_naive_ran():
    case = cases.dense("t", B=1, H=1, L=8, D=8)  # bf16
    naive = {"impl": "naive", "check_errors": {"out": 4e-3, "dq": 5e-3}}
    ours = {"impl": "fmha", "check_errors": {"out": 8.0e-3, "dq": 1.2e-2}}
    apply_tolerances(case, [ours, naive])
    assert ours["check_tensor"] == "dq" and not ours["check_ok"]  # 1.2e-2 > 2 * 5e-3 + 1e-4
    assert ours["check_tolerance"] == pytest.approx(1.01e-2)
    ours["check_errors"]["dq"] = 1.0e-2
    apply_tolerances(case, [ours, naive])
    assert ours["check_ok"] and ours["check_tensor"] == "dq"
    alone = {"impl": "fmha", "check_errors": {"out": 2e-2}}  # no naive: fixed bf16 bound 3e-2
    apply_tolerances(case, [alone])
    assert alone["check_ok"] and alone["check_tolerance"] == 3e-2


def test_plots_and_summary_from_synthetic_gpu_records(tmp_path):
    """The memory plot and summary only get real data on CUDA: exercise them with made-up rows."""
    pytest.importorskip("matplotlib")
    from fmha.bench import report

    records = []
    for impl, is_peer, per_token in (("fmha", False, 1.0), ("sdpa-flash", True, 1.5),
                                     ("naive", True, None)):
        for L in (1024, 2048, 4096):
            r = {"case": f"memory L{L}", "impl": impl, "is_peer": is_peer,
                 "direction": "fwd+bwd", "group": "B=1 H=16 D=128", "seq_len": L,
                 "status": "ok" if per_token else "n/a", "reason": "" if per_token else "too big"}
            if per_token:
                r["peak_extra_bytes"] = int(per_token * L * 2**20)
            records.append(r)
    meta = {"device_name": "Test GPU", "torch_version": torch.__version__}
    paths = report.write_plots(str(tmp_path), "memory", meta, records, memory=True)
    assert [os.path.basename(p) for p in paths] == ["memory_peak.png"]
    assert os.path.getsize(paths[0]) > 0
    summary = report.format_summary(records, memory=True)
    assert "1.50x" in summary and "sdpa-flash" in summary
    table = report.format_table(records, memory=True)
    assert "n/a: too big" in table


def test_learned_shared_bias_is_a_checked_gradient(tmp_path):
    """A [1, H, L, L] bias with bias_grad: every implementation's dbias (summed over the batch) is
    checked against the reference, fmha's included."""
    out = tmp_path / "results"
    main(["--suite", "features", "--device", "cpu", "--out", str(out), "--impls",
          "fmha,sdpa-math,naive", "--cases", r"^dbias \[1,H,L,L\]", "--directions", "bwd",
          "--budget-ms", "1", "--min-reps", "2", "--max-reps", "2"])
    records = json.loads((out / "features.json").read_text())["records"]
    assert {r["impl"] for r in records} == {"fmha", "sdpa-math", "naive"}
    for r in records:
        assert r["status"] == "ok", r
        assert "dbias" in r["check_errors"] and r["check_ok"], r


def test_backward_impl_both_times_fmha_fused_and_split(tmp_path):
    """--backward-impl both: --impls fmha selects fmha-fused and fmha-split, each checked, timed
    and compared with the best peer on its own row and summary line."""
    out = tmp_path / "results"
    main(["--suite", "quick", "--device", "cpu", "--out", str(out), "--impls", "fmha,naive",
          "--cases", "^D32 L128$", "--directions", "bwd", "--backward-impl", "both",
          "--budget-ms", "1", "--min-reps", "2", "--max-reps", "2", "--no-plots"])
    data = json.loads((out / "quick.json").read_text())
    assert data["meta"]["impls"] == ["fmha-fused", "fmha-split", "naive"]
    records = data["records"]
    assert [r["impl"] for r in records] == ["fmha-fused", "fmha-split", "naive"]
    for r in records[:2]:
        assert not r["is_peer"] and r["status"] == "ok" and r["check_ok"], r
        assert r["best_peer"] == "naive" and r["vs_best_peer"] > 0
    summary = (out / "summary.txt").read_text()
    assert " fmha-fused " in summary and " fmha-split " in summary
    assert "| fmha-fused | bwd |" in (out / "quick.md").read_text()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_queue_us_spins_on_cuda_and_is_ignored_on_cpu(tmp_path, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    out = tmp_path / "results"
    main(["--suite", "quick", "--device", device, "--out", str(out), "--impls", "fmha",
          "--cases", "^D32 L128$", "--directions", "fwd", "--budget-ms", "1", "--min-reps", "2",
          "--max-reps", "2", "--queue-us", "50", "--no-plots", "--no-check"])
    meta = json.loads((out / "quick.json").read_text())["meta"]
    assert ("spinning 50 us" in meta["timing"]) == (device == "cuda"), meta["timing"]
    if device == "cuda":
        from fmha.bench.timing import Timer, TimerSettings

        timer = Timer("cuda", TimerSettings(queue_us=50))
        assert timer._queue_cycles > 0
        assert timer.measure(lambda i: None)["median_ms"] >= 0


def test_decode_suite_times_contiguous_and_paged_caches_against_sdpa(tmp_path):
    """The decode suite on CPU, one small case: fmha on a contiguous cache and on pages (16, and
    256 which leaves the last page partly filled), SDPA's math backend and naive on the same
    keys; every row checked against the reference and rated in TB/s."""
    out = tmp_path / "results"
    rc = main(["--suite", "decode", "--device", "cpu", "--out", str(out), "--impls",
               "fmha,sdpa-math,naive", "--cases", "^GQA 8/2 D64 B4 L1000$", "--page-sizes",
               "16,256", "--budget-ms", "1", "--min-reps", "2", "--max-reps", "2"])
    data = json.loads((out / "decode.json").read_text())
    assert data["meta"]["suite"] == "decode" and "bytes" in data["meta"]
    records = data["records"]
    assert [r["impl"] for r in records] == ["fmha", "fmha-paged16", "fmha-paged256",
                                            "sdpa-math", "naive"]
    case = cases.decode("t", B=4, H=8, Hkv=2, L=1000, D=64, dtype="fp32")
    expected_bytes = (4 * 1000 * 2 * 128 + 4 * 8 * 128) * 4
    for r in records:
        assert r["case"] == "GQA 8/2 D64 B4 L1000" and r["direction"] == "fwd"
        assert r["status"] == "ok" and r["check_ok"], r
        assert set(r["check_errors"]) == {"out"}
        assert r["bytes"] == expected_bytes == flops.bytes_moved(case, 4)
        assert r["tbps"] == pytest.approx(r["bytes"] / (r["median_ms"] * 1e-3) / 1e12)
        assert r["vs_best_peer"] > 0
    assert rc == 0
    summary = (out / "summary.txt").read_text()
    assert "TB/s" in summary and " fmha-paged16 " in summary
    markdown = (out / "decode.md").read_text()
    assert "TB/s (of copy)" in markdown
    assert "| GQA 8/2 D64 B4 L1000 | fmha-paged256 | fwd |" in markdown


def test_decode_cases_cover_the_issue_grid():
    gpu = cases.suite_cases("decode", "cuda")
    assert len(gpu) == 3 * 3 * 3 * 3  # heads x D x B x L
    assert {(c.H, c.hkv) for c in gpu} == {(32, 8), (32, 32), (32, 1)}
    assert all(c.Lq == 1 and c.directions == ("fwd",) and c.dtype == "bf16" for c in gpu)
    assert {c.Lk for c in gpu} == {4096, 32768, 131072} and {c.B for c in gpu} == {1, 8, 64}
    assert all(flops.visible_pairs(c) == c.B * c.H * c.Lk for c in gpu)
