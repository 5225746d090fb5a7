"""bench/jax_attention.py's feature cases on the CPU: the peers' materialised forms (the expanded
rel-pos bias, the neighborhood mask) compute what fmha.jax computes, and the script's smoke run
prints every case with fmha within float32 rounding of XLA."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import pathlib

import numpy as np
import pytest

pytest.importorskip("jax")
try:
    import fmha.jax  # noqa: F401
except ImportError as error:  # built without jax: fmha.jax exists but has no extension to load
    pytest.skip(f"fmha.jax is not available: {error}", allow_module_level=True)

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "jax_attention.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("jax_attention_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("grid,kernel", [((5, 7), 3), ((8, 8), 5), ((6, 4), 4), ((9, 9), 9)])
def test_neighborhood_mask_is_spec_windows(bench, grid, kernel):
    mask = bench.neighborhood_mask(grid, kernel)
    length = grid[0] * grid[1]
    assert mask.shape == (length, length)
    for i in range(length):
        y, x = divmod(i, grid[1])
        keys = {divmod(j, grid[1]) for j in np.flatnonzero(mask[i])}
        start_y = min(max(y - kernel // 2, 0), grid[0] - kernel)
        start_x = min(max(x - kernel // 2, 0), grid[1] - kernel)
        expect = {(a, b) for a in range(start_y, start_y + kernel)
                  for b in range(start_x, start_x + kernel)}  # fmt: skip
        assert keys == expect


def test_feature_smoke_run_agrees_with_xla(bench):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        bench.main(["--features", "--smoke", "--device", "cpu", "--impls", "fmha,xla",
                    "--dtype", "float32", "--iters", "1", "--warmup", "1", "--direction", "fwd"])  # fmt: skip
    rows = [line for line in printed.getvalue().splitlines() if line.startswith("| ") and " fwd " in line]
    assert len(rows) == len(bench.FEATURE_CASES)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert not any(c.startswith("n/a") for c in cells), row
        assert float(cells[-1]) < 1e-5, row
