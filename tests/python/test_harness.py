"""The test harness's own rules: on CUDA only the refusals listed in EXPECTED_CUDA_REFUSALS skip a
test; any other NotImplementedError fails it, and on CPU every refusal is raised as is."""

from __future__ import annotations

import pytest

from harness import EXPECTED_CUDA_REFUSALS, call


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
