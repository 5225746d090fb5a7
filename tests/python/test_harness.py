"""The test harness's own rules: on CUDA only the refusals listed in EXPECTED_CUDA_REFUSALS skip a
test; any other NotImplementedError fails it, and on CPU every refusal is raised as is. A head-dim
bucket left out of the build skips any test that meets it (conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from cuda_refusals import EXPECTED_CUDA_REFUSALS
from harness import call


def _refuse(message):
    def fn():
        raise NotImplementedError(message)

    return fn


@pytest.mark.parametrize("case", sorted(EXPECTED_CUDA_REFUSALS))
def test_an_expected_cuda_refusal_skips(case):
    message = f"fmha: the CUDA backward does not support {EXPECTED_CUDA_REFUSALS[case]} yet"
    with pytest.raises(pytest.skip.Exception, match=case):
        call("cuda", _refuse(message))


def test_an_unexpected_cuda_refusal_fails():
    message = "fmha: the CUDA forward kernel does not support this new case at all"
    with pytest.raises(pytest.fail.Exception, match="unexpected CUDA refusal"):
        call("cuda", _refuse(message))


def test_a_cpu_refusal_is_raised():
    with pytest.raises(NotImplementedError):
        call("cpu", _refuse("fmha: " + EXPECTED_CUDA_REFUSALS["shared memory of this GPU"]))


def test_a_call_that_runs_returns_its_value():
    assert call("cuda", lambda x: x + 1, 41) == 42


def test_an_unbuilt_bucket_skips_any_test_that_meets_it(tmp_path):
    """conftest.py in a pytest run of its own: the refusal skips a test in its body or its fixture,
    with the library's message; another refusal, another exception with the same words and a
    failure raised while handling the refusal still fail."""
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("conftest.py", "cuda_refusals.py"):
        shutil.copy(os.path.join(here, name), tmp_path / name)
    (tmp_path / "test_refused.py").write_text(textwrap.dedent("""
        import pytest

        BUCKET = ("fmha: head_dim 32 / value_dim 24 runs in the head-dim bucket 32, which this "
                  "build of the CUDA backend left out; rebuild with it in the CMake option "
                  "FMHA_HEAD_DIM_BUCKETS")

        @pytest.fixture
        def refused():
            raise NotImplementedError(BUCKET)

        def test_body():
            raise NotImplementedError(BUCKET)

        def test_fixture(refused):
            pass

        def test_other_refusal():
            raise NotImplementedError("fmha: the CUDA backward does not support this yet")

        def test_other_exception():
            raise RuntimeError(BUCKET)

        def test_failure_while_handling():
            try:
                raise NotImplementedError(BUCKET)
            except NotImplementedError:
                assert False, "a wrong result"
    """))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          "test_refused.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert "3 failed, 2 skipped" in run.stdout, run.stdout + run.stderr
    skipped = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all("head-dim bucket 32, which this build" in line for line in skipped), (
        run.stdout
    )
