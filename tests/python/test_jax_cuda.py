"""fmha.jax on a GPU: the CUDA handlers against the float64 reference of test_jax.py, computed on
the CPU from the same inputs. Forward out and lse and the gradient of every floating input through
jax.grad (q, k, v, bias, sinks; dlse through a loss that uses lse), under jit and vmap, in
bf16 / fp16 (SPEC §13: 2 x the error of a naive same-dtype computation + 1e-4, as harness.py) and
fp32 (1e-5).

Runs only where jax has a GPU backend and fmha.jax was built with the CUDA backend; elsewhere the
module skips and says which is missing. A call whose head-dim bucket this build left out
(FMHA_HEAD_DIM_BUCKETS) skips its test with the library's message, as conftest.py does for the
PyTorch tests; every other error fails."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")


def _first_gpu():
    try:
        return jax.devices("gpu")[0]
    except (RuntimeError, IndexError):  # RuntimeError: jax has no GPU backend at all
        return None


GPU = _first_gpu()
if GPU is None:
    pytest.skip("jax has no GPU backend (jax.devices('gpu') is empty): fmha.jax's CUDA handlers "
                "are tested on a GPU only", allow_module_level=True)  # fmt: skip
try:
    import fmha.jax as fj
    from fmha import _jax_ffi
except ImportError as error:
    pytest.skip(f"fmha.jax is not available: {error}", allow_module_level=True)
if not _jax_ffi.built_with_cuda():
    pytest.skip("this fmha was built without the CUDA backend: fmha.jax registered CPU handlers "
                "only", allow_module_level=True)  # fmt: skip

import jax.numpy as jnp  # noqa: E402
import test_jax as tj  # noqa: E402  the float64 reference and masks (it enables jax_enable_x64)
from cuda_refusals import BUCKET_NOT_BUILT  # noqa: E402

CPU = jax.devices("cpu")[0]
F32_TOL = tj.F32_TOL  # SPEC §13: fp32, exact mode
DTYPES = [pytest.param(jnp.bfloat16, id="bf16"), pytest.param(jnp.float16, id="f16"),
          pytest.param(jnp.float32, id="f32")]  # fmt: skip
# A refusal found when the computation runs (the trace-time check validates as the CPU backend
# does, so a bucket left out is found there) arrives as the computation's error: JaxRuntimeError,
# or XlaRuntimeError (a RuntimeError) in older jax.
_RUNTIME_ERROR = getattr(jax.errors, "JaxRuntimeError", RuntimeError)


def cuda_test(test):
    """test, skipped with the library's message where a call meets a head-dim bucket that this
    build of the CUDA backend left out; any other error, other refusals included, fails."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        try:
            return test(*args, **kwargs)
        except (NotImplementedError, _RUNTIME_ERROR) as error:
            if BUCKET_NOT_BUILT not in str(error):
                raise
            pytest.skip(f"head-dim bucket left out of this build: {error}")

    return run


# ---- The comparison ------------------------------------------------------------------------------


def naive(q, k, v, *, scale=None, visible=None, bias=None, softcap=0.0, sinks=None):
    """SPEC §13's naive computation, in q's dtype: the scores materialised, each step rounded to
    that dtype (the matrix products accumulate as XLA's do on the GPU). Unlike the reference it
    assumes that every query row sees a key: the tests here have none without."""
    dtype = q.dtype
    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = jnp.einsum("bihd,bjhd->bhij", q, k) * jnp.asarray(scale, dtype)
    if softcap > 0:
        s = softcap * jnp.tanh(s / softcap)
    if bias is not None:
        s = s + bias.astype(dtype)
    if visible is not None:
        s = jnp.where(visible[:, None] if visible.ndim == 3 else visible, s, -jnp.inf)
    columns = s
    if sinks is not None:
        sink_column = jnp.broadcast_to(sinks.astype(dtype)[None, :, None, None], (*s.shape[:-1], 1))
        columns = jnp.concatenate([s, sink_column], axis=-1)
    lse = jax.nn.logsumexp(columns, axis=-1)
    p = jnp.exp(s - lse[..., None])
    return jnp.einsum("bhij,bjhd->bihd", p, v), lse


def _results(fn, xs, w, u) -> dict:
    """{out, lse, d<name>}: fn(xs) -> (out, lse) under jit, and the gradient of
    sum(out * w) + sum(lse * u) (lse -inf counts 0) with respect to every array of xs."""

    def loss(xs):
        out, lse = fn(xs)
        lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
        return jnp.sum(out.astype(w.dtype) * w) + jnp.sum(lse.astype(u.dtype) * u)

    out, lse = jax.jit(fn)(xs)
    grads = jax.jit(jax.grad(loss))(xs)
    return {"out": out, "lse": lse, **{f"d{n}": g for n, g in grads.items()}}


def check(ours, ref, inputs: dict, *, seed=100):
    """ours(**inputs) -> (out, lse): fmha on the GPU. ref(attend, **inputs) -> (out, lse): the
    same function written with attend = tj.reference (float64 on the CPU: the oracle) or naive
    (the inputs' dtype on the GPU: the scale of the 16-bit bound). Floating inputs are
    differentiated; the others (cu_seqlens) are held fixed."""
    dtype = inputs["q"].dtype
    names = [n for n, x in inputs.items() if jnp.issubdtype(x.dtype, jnp.floating)]
    fixed = {n: x for n, x in inputs.items() if n not in names}
    fixed_gpu, fixed_cpu = ({n: jax.device_put(x, device) for n, x in fixed.items()}
                            for device in (GPU, CPU))  # fmt: skip
    on_gpu = {n: jax.device_put(inputs[n], GPU) for n in names}
    on_cpu = {n: jax.device_put(inputs[n], CPU).astype(jnp.float64) for n in names}

    def ours_on_gpu(xs):
        return ours(**xs, **fixed_gpu)

    out_shape, lse_shape = (x.shape for x in jax.eval_shape(ours_on_gpu, on_gpu))
    # Loss weights exact in the inputs' dtype: every run gets the same dout.
    w = np.asarray(tj.randn(seed, out_shape, dtype), np.float64)
    u = np.asarray(tj.randn(seed + 1, lse_shape), np.float64)
    w_gpu, u_gpu = (jax.device_put(jnp.asarray(x, jnp.float32), GPU) for x in (w, u))
    got = _results(ours_on_gpu, on_gpu, w_gpu, u_gpu)
    with jax.default_device(CPU):
        w_cpu, u_cpu = (jax.device_put(jnp.asarray(x, jnp.float64), CPU) for x in (w, u))
        want = _results(lambda xs: ref(tj.reference, **xs, **fixed_cpu), on_cpu, w_cpu, u_cpu)
    low_precision = dtype in (jnp.bfloat16, jnp.float16)
    if low_precision:
        same_dtype = _results(lambda xs: ref(naive, **xs, **fixed_gpu), on_gpu, w_gpu, u_gpu)

    out, lse = got["out"], got["lse"]
    assert out.dtype == dtype and lse.dtype == jnp.float32, (out.dtype, lse.dtype)
    for n in names:
        assert got[f"d{n}"].dtype == inputs[n].dtype, f"d{n} has dtype {got[f'd{n}'].dtype}"
    for name, value in got.items():
        # SPEC §13: 2 x the naive same-dtype error + 1e-4 for fp16/bf16, 1e-5 for fp32.
        bound = 2 * tj.rel_error(same_dtype[name], want[name]) + 1e-4 if low_precision else F32_TOL
        tj.assert_close(value, want[name], bound, name)


# ---- Dense attention -----------------------------------------------------------------------------

B, LQ, LK, H, D = 2, 113, 239, 4, 64  # Lq < Lk: every row sees a key under the masks below

DENSE_CASES = {
    # name: (options, kv heads, extra inputs by name and shape)
    "plain": ({}, H, {}),
    "causal": ({"causal": True}, H, {}),
    "causal_bottom_right": ({"causal": True, "causal_alignment": "bottom_right"}, H, {}),
    "gqa_causal": ({"causal": True}, 2, {}),
    "mqa_window": ({"window": (40, 8)}, 1, {}),
    "softcap_scale": ({"softcap": 4.0, "scale": 0.2, "causal": True}, 2, {}),
    "bias": ({"causal": True}, 2, {"bias": (B, H, LQ, LK)}),
    "bias_broadcast": ({}, H, {"bias": (H, 1, LK)}),
    "sinks_window": ({"window": (64, 0)}, 2, {"sinks": (H,)}),
    "bias_sinks_softcap": ({"softcap": 6.0, "causal": True}, 2, {"bias": (1, H, LQ, LK),
                                                                 "sinks": (H,)}),
}


def extra_inputs(shapes: dict, dtype, seed=10) -> dict:
    """Optional inputs: bias in the dtype of q, sinks float32."""
    return {n: tj.randn(seed + i, shape, jnp.float32 if n == "sinks" else dtype)
            for i, (n, shape) in enumerate(shapes.items())}  # fmt: skip


def dense_check(opts, inputs):
    Lq, Lk = inputs["q"].shape[1], inputs["k"].shape[1]
    visible = tj.mask_causal_window(Lq, Lk, opts.get("causal", False),
                                    opts.get("causal_alignment") == "bottom_right",
                                    opts.get("window"))  # fmt: skip

    def ours(q, k, v, **extra):
        return fj.attention(q, k, v, return_lse=True, **opts, **extra)

    def ref(attend, q, k, v, **extra):
        return attend(q, k, v, scale=opts.get("scale"), softcap=opts.get("softcap", 0.0),
                      visible=visible, **extra)  # fmt: skip

    check(ours, ref, inputs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(DENSE_CASES))
@cuda_test
def test_dense(case, dtype):
    opts, kv_heads, extra = DENSE_CASES[case]
    inputs = {**tj.qkv(B=B, Lq=LQ, Lk=LK, H=H, Hkv=kv_heads, D=D, dtype=dtype),
              **extra_inputs(extra, dtype)}  # fmt: skip
    dense_check(opts, inputs)


# Odd head dims inside buckets 64 and 128, whole buckets, Dv != D, and buckets a build may leave
# out (FMHA_HEAD_DIM_BUCKETS): those skip.
HEAD_DIMS = [(40, 40), (64, 64), (96, 96), (120, 120), (128, 128), (128, 64), (200, 200),
             (256, 256)]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims", HEAD_DIMS, ids=[f"D{d}_Dv{dv}" for d, dv in HEAD_DIMS])
@cuda_test
def test_head_dims(dims, dtype):
    head_dim, value_dim = dims
    inputs = tj.qkv(B=2, Lq=97, Lk=161, H=4, Hkv=2, D=head_dim, Dv=value_dim, dtype=dtype)
    dense_check({"causal": True, "causal_alignment": "bottom_right"}, inputs)


# ---- Varlen, neighborhood, merge -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@cuda_test
def test_varlen(dtype):
    lens_q, lens_k = [17, 0, 130, 64], [40, 3, 130, 97]  # lens_q <= lens_k: every row sees a key
    starts_q, starts_k = np.cumsum([0, *lens_q]).tolist(), np.cumsum([0, *lens_k]).tolist()
    heads, kv_heads, batch = 4, 2, len(lens_q)
    inputs = {"q": tj.randn(0, (starts_q[-1], heads, D), dtype),
              "k": tj.randn(1, (starts_k[-1], kv_heads, D), dtype),
              "v": tj.randn(2, (starts_k[-1], kv_heads, D), dtype),
              **extra_inputs({"sinks": (heads,), "bias": (batch, heads, max(lens_q), max(lens_k))},
                             dtype),
              "cu_q": jnp.asarray(starts_q, jnp.int32),
              "cu_k": jnp.asarray(starts_k, jnp.int32)}  # fmt: skip

    def ours(q, k, v, sinks, bias, cu_q, cu_k):
        return fj.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                   causal_alignment="bottom_right", sinks=sinks, bias=bias,
                                   return_lse=True)  # fmt: skip

    def ref(attend, q, k, v, sinks, bias, cu_q, cu_k):
        outs, lses = [], []
        for b in range(batch):
            rows_q = slice(starts_q[b], starts_q[b + 1])
            rows_k = slice(starts_k[b], starts_k[b + 1])
            visible = tj.mask_causal_window(lens_q[b], lens_k[b], True, True)
            o, l_ = attend(q[None, rows_q], k[None, rows_k], v[None, rows_k], sinks=sinks,
                           bias=bias[b : b + 1, :, : lens_q[b], : lens_k[b]], visible=visible)
            outs.append(o[0])
            lses.append(l_[0])
        return jnp.concatenate(outs, 0), jnp.concatenate(lses, -1)

    check(ours, ref, inputs)


@pytest.mark.parametrize("dtype", DTYPES)
@cuda_test
def test_na2d(dtype):
    grid, kernel_size, dilation, causal = (9, 12), (3, 5), (1, 2), (False, True)
    visible = tj.mask_neighborhood(grid, kernel_size, dilation, causal)
    heads, kv_heads, tokens = 4, 2, math.prod(grid)
    inputs = {"q": tj.randn(0, (2, *grid, heads, D), dtype),
              "k": tj.randn(1, (2, *grid, kv_heads, D), dtype),
              "v": tj.randn(2, (2, *grid, kv_heads, D), dtype),
              **extra_inputs({"sinks": (heads,)}, dtype)}  # fmt: skip

    def ours(q, k, v, sinks):
        return fj.na2d(q, k, v, kernel_size, dilation, causal, sinks=sinks, return_lse=True)

    def ref(attend, q, k, v, sinks):
        flat = [x.reshape(2, tokens, *x.shape[-2:]) for x in (q, k, v)]
        o, l_ = attend(*flat, sinks=sinks, visible=visible)
        return o.reshape(2, *grid, heads, D), l_.reshape(2, heads, *grid)

    check(ours, ref, inputs)


@pytest.mark.parametrize("dtype", DTYPES)
@cuda_test
def test_merge_attentions(dtype):
    # Three parts of the keys; the sinks join the first part only (SPEC §12).
    inputs = {**tj.qkv(B=B, Lq=LQ, Lk=LK, H=H, Hkv=2, D=D, dtype=dtype),
              **extra_inputs({"sinks": (H,)}, dtype)}  # fmt: skip
    parts = [(0, 64), (64, 200), (200, LK)]

    def ours(q, k, v, sinks):
        outs, lses = zip(*(fj.attention(q, k[:, a:b], v[:, a:b], sinks=sinks if a == 0 else None,
                                        return_lse=True) for a, b in parts))  # fmt: skip
        return fj.merge_attentions(list(outs), list(lses))

    check(ours, lambda attend, q, k, v, sinks: attend(q, k, v, sinks=sinks), inputs)


# ---- Transformations -----------------------------------------------------------------------------

VMAP_AXES = {"q_only": (0, None, None, None, None), "qkv": (0, 0, 0, None, None)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axes", list(VMAP_AXES))
@cuda_test
def test_vmap_over_a_leading_axis(axes, dtype):
    # q, k, v [3, B, L, H, D] where vmapped; bias and sinks shared by the elements (their
    # gradients sum over the vmapped axis).
    in_axes, size, Lq, Lk = VMAP_AXES[axes], 3, 65, 80
    q, k, v = tj.qkv(B=2, Lq=Lq, Lk=Lk, H=H, Hkv=2, D=D, dtype=dtype).values()
    inputs = {n: jnp.stack([x * (1 + 0.25 * i) for i in range(size)]) if ax == 0 else x
              for (n, x), ax in zip({"q": q, "k": k, "v": v}.items(), in_axes)}  # fmt: skip
    inputs.update(extra_inputs({"bias": (H, Lq, Lk), "sinks": (H,)}, dtype))
    visible = tj.mask_causal_window(Lq, Lk, True)

    def ours(q, k, v, bias, sinks):
        def one(q, k, v, b, s):
            return fj.attention(q, k, v, bias=b, sinks=s, causal=True, return_lse=True)

        return jax.vmap(one, in_axes)(q, k, v, bias, sinks)

    def ref(attend, q, k, v, bias, sinks):
        def one(q, k, v, b, s):
            return attend(q, k, v, bias=b, sinks=s, visible=visible)

        return jax.vmap(one, in_axes)(q, k, v, bias, sinks)

    check(ours, ref, inputs)


@cuda_test
def test_results_on_the_gpu_and_deterministic_is_bitwise():
    # Enough keys and queries for several blocks to add to each dq row (the order that
    # deterministic=True fixes); a bias of its own per batch (a broadcast one's deterministic
    # dbias is refused on CUDA).
    inputs = {**tj.qkv(B=2, Lq=384, Lk=512, H=4, Hkv=2, D=D, dtype=jnp.bfloat16),
              **extra_inputs({"bias": (2, 4, 384, 512), "sinks": (4,)}, jnp.bfloat16)}  # fmt: skip
    inputs = {n: jax.device_put(x, GPU) for n, x in inputs.items()}

    def run(q, k, v, bias, sinks):
        def f(q, k, v, bias, sinks):
            return fj.attention(q, k, v, bias=bias, sinks=sinks, causal=True, return_lse=True,
                                deterministic=True)  # fmt: skip

        def loss(*xs):
            out, lse = f(*xs)
            return jnp.sum(out.astype(jnp.float32) ** 2) + jnp.sum(jnp.sin(lse))

        return (*f(q, k, v, bias, sinks), *jax.grad(loss, argnums=range(5))(q, k, v, bias, sinks))

    first, second = jax.jit(run)(**inputs), jax.jit(run)(**inputs)
    names = ("out", "lse", "dq", "dk", "dv", "dbias", "dsinks")
    for name, a, b in zip(names, first, second):
        assert a.devices() == {GPU}, f"{name} is on {a.devices()}, not {GPU}"
        assert np.array_equal(np.asarray(a), np.asarray(b)), f"{name} differs between two runs"
    eager = fj.attention(inputs["q"], inputs["k"], inputs["v"])  # outside jit too
    assert eager.devices() == {GPU}
