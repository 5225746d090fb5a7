"""The arguments that are not tensors: one set of rules (fmha._arguments) for the PyTorch and the
JAX front ends, so both refuse the same bad option with the same message (SPEC §14), and neither
front end loads the other's framework."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import fmha
import fmha._arguments

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fmha.__file__)))


def _run(code: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_PACKAGE_ROOT, *sys.path]))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


def test_the_shared_rules_import_neither_framework():
    _run(
        "import sys, fmha._arguments\n"
        "loaded = {'torch', 'jax'} & set(sys.modules)\n"
        "assert not loaded, f'fmha._arguments imported {sorted(loaded)}'\n"
    )


def test_the_torch_front_end_does_not_import_jax():
    _run(
        "import sys, torch, fmha\n"
        "x = torch.ones(1, 4, 2, 8)\n"
        "fmha.attention(x, x, x, window=(1, 1))\n"
        "fmha.na1d(x, x, x, 3)\n"
        "assert 'jax' not in sys.modules, 'fmha imported jax'\n"
    )


# name -> options of attention (or kernel_size of na1d) that both front ends refuse with the same
# exception and message.
BAD_OPTIONS = {
    "causal_alignment": dict(causal=True, causal_alignment="bottom"),
    "backward_impl": dict(backward_impl="fast"),
    "window_not_pair": dict(window=3),
    "window_float": dict(window=(1.5, 2)),
    "window_past_int64": dict(window=(0, 2**63)),
    "scale_string": dict(scale="0.5"),
    "softcap_none": dict(softcap=None),
    "causal_string": dict(causal="False"),
    "deterministic_string": dict(deterministic="no"),
    "return_lse_string": dict(return_lse="yes"),
    "allow_tf32_bytes": dict(allow_tf32=b"1"),
    "na_kernel_float": dict(kernel_size=3.5),
    "na_tuple_length": dict(kernel_size=(3, 3)),
    "na_dilation_past_int64": dict(kernel_size=3, dilation=2**64),
    "na_is_causal_string": dict(kernel_size=3, is_causal="yes"),
}


def _refusal(call):
    with pytest.raises((TypeError, ValueError)) as error:
        call()
    return type(error.value), str(error.value)


def _call(module, make, options):
    q = make((1, 8, 2, 4))
    if "kernel_size" in options:
        return lambda: module.na1d(q, q, q, **options)
    return lambda: module.attention(q, q, q, **options)


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_both_front_ends_refuse_a_bad_option_alike(case):
    pytest.importorskip("jax")
    try:
        import fmha.jax as fj
    except ImportError as error:
        pytest.skip(f"fmha.jax is not available: {error}")
    import jax.numpy as jnp

    options = BAD_OPTIONS[case]
    torch_refusal = _refusal(_call(fmha, torch.zeros, options))
    jax_refusal = _refusal(_call(fj, lambda shape: jnp.zeros(shape, jnp.float32), options))
    assert jax_refusal == torch_refusal
    assert torch_refusal[1].startswith("fmha: ")


def test_merge_refuses_what_is_not_a_list_alike():
    pytest.importorskip("jax")
    try:
        import fmha.jax as fj
    except ImportError as error:
        pytest.skip(f"fmha.jax is not available: {error}")
    with pytest.raises(TypeError, match="lists of tensors, got Tensor and list"):
        fmha.merge_attentions(torch.zeros(1), [])
    with pytest.raises(TypeError, match="lists of arrays, got int and list"):
        fj.merge_attentions(0, [])


def test_a_traced_option_is_refused_with_a_hint():
    jax = pytest.importorskip("jax")
    try:
        import fmha.jax as fj
    except ImportError as error:
        pytest.skip(f"fmha.jax is not available: {error}")
    import jax.numpy as jnp

    q = jnp.zeros((1, 8, 2, 4), jnp.float32)
    for options in (lambda s: dict(scale=s), lambda s: dict(window=(s, 0)),
                    lambda s: dict(causal=s)):  # fmt: skip
        with pytest.raises(TypeError, match=r"\(a traced value: pass it as a static argument\)"):
            jax.jit(lambda s: fj.attention(q, q, q, **options(s)))(1)


@pytest.mark.parametrize(
    "convert, value, expected",
    [
        (fmha._arguments.to_int, True, 1),
        (fmha._arguments.to_int, torch.tensor(3), 3),
        (fmha._arguments.to_float, 2, 2.0),
        (fmha._arguments.to_float, torch.tensor(0.5), 0.5),
        (fmha._arguments.to_bool, None, False),
        (fmha._arguments.to_bool, torch.tensor(True), True),
    ],
)
def test_scalars_convert_as_python_would(convert, value, expected):
    result = convert(value, "x")
    assert result == expected and type(result) is type(expected)


def test_a_long_value_is_shown_cut_short():
    with pytest.raises(TypeError) as error:
        fmha._arguments.to_int(torch.zeros(100), "x")
    message = str(error.value)
    assert message.startswith("fmha: x is tensor([0., 0.,"), message
    assert message.endswith("... (Tensor); accepted: an int"), message
