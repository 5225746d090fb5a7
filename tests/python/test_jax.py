"""fmha.jax on the CPU: every feature and every gradient against a float64 reference written
here in jax.numpy (SPEC §2-§12, tolerances of §13), under jit, grad and vmap; errors with the
library's message; `import fmha.jax` without torch. Skipped when jax is not installed, or when
the installed fmha was built without its JAX extension."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)  # the reference computes in float64

import jax.numpy as jnp  # noqa: E402

try:
    import fmha.jax as fj  # noqa: E402
except ImportError as error:  # an fmha built before jax was installed (scripts/test.sh checks CI's)
    pytest.skip(f"fmha.jax is not available: {error}", allow_module_level=True)

F32_TOL = 1e-5  # SPEC §13: fp32, exact mode, norm-wise relative error
F64_TOL = 1e-10
_NEG = -1e30  # a masked score in the reference: finite, so its gradients stay finite


# ---- Reference -----------------------------------------------------------------------------------


def _f64(x):
    return None if x is None else jnp.asarray(x, jnp.float64)


def reference(q, k, v, *, scale=None, visible=None, bias=None, rel_pos=None, softcap=0.0,
              sinks=None, extra_kv=None):  # fmt: skip
    """(out, lse) of SPEC §2-§10 in float64. visible: [Lq, Lk] or [B, Lq, Lk] bool mask."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    B, Lq, H, D = q.shape
    Lk, Hkv = k.shape[1], k.shape[2]
    groups = H // Hkv
    # Scalar options cross the C++ API as float32, the default scale too (1.0f / sqrtf(D)): the
    # reference uses the same numbers, so float64 runs are not limited by their rounding.
    scale = float(np.float32(1.0) / np.sqrt(np.float32(D)) if scale is None else np.float32(scale))
    softcap = float(np.float32(softcap))

    def scores(keys):
        s = scale * jnp.einsum("bihd,bjhd->bhij", q, jnp.repeat(keys, groups, axis=2))
        return softcap * jnp.tanh(s / softcap) if softcap > 0 else s

    s = scores(k)
    if bias is not None:
        s = s + _f64(bias)
    if rel_pos is not None:
        rel_h, rel_w = _f64(rel_pos[0]), _f64(rel_pos[1])
        s = s + (rel_h[..., :, None] + rel_w[..., None, :]).reshape(*rel_h.shape[:-1], Lk)
    if visible is None:
        visible = jnp.ones((Lq, Lk), bool)
    visible = jnp.broadcast_to(visible[:, None] if visible.ndim == 3 else visible, s.shape)
    s = jnp.where(visible, s, _NEG)
    values = jnp.repeat(v, groups, axis=2)
    if extra_kv is not None:
        extra_k, extra_v = _f64(extra_kv[0]), _f64(extra_kv[1])
        s = jnp.concatenate([s, scores(extra_k)], axis=-1)
        visible = jnp.concatenate([visible, jnp.ones(s.shape[:-1] + (extra_k.shape[1],), bool)], -1)
        values = jnp.concatenate([values, jnp.repeat(extra_v, groups, axis=2)], axis=1)
    columns = [s]
    if sinks is not None:
        columns.append(jnp.broadcast_to(_f64(sinks)[None, :, None, None], (B, H, Lq, 1)))
    lse = jax.nn.logsumexp(jnp.concatenate(columns, axis=-1), axis=-1)
    p = jnp.where(visible, jnp.exp(s - lse[..., None]), 0.0)
    out = jnp.einsum("bhij,bjhd->bihd", p, values)
    seen = jnp.any(visible, axis=-1) | (sinks is not None)
    return jnp.where(seen.transpose(0, 2, 1)[..., None], out, 0.0), jnp.where(seen, lse, -jnp.inf)


def mask_causal_window(Lq, Lk, causal=False, bottom_right=False, window=None):
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    d = i + (Lk - Lq if bottom_right else 0)
    visible = np.ones((Lq, Lk), bool)
    if causal:
        visible &= j <= d
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= j >= d - left
        if right >= 0:
            visible &= j <= d + right
    return jnp.asarray(visible)


def mask_neighborhood(grid, kernel_size, dilation, causal):
    """[N, N] over the flattened grid (SPEC §6)."""
    axes = []
    for X, K, dil, c in zip(grid, kernel_size, dilation, causal):
        x, y = np.arange(X)[:, None], np.arange(X)[None, :]
        g, p = x % dil, x // dil
        n = -(-(X - g) // dil)
        t = y // dil
        if c:
            ok = (t >= np.maximum(p - K + 1, 0)) & (t <= p)
        else:
            start = np.clip(p - K // 2, 0, n - K)
            ok = (t >= start) & (t < start + K)
        axes.append(ok & (y % dil == g))
    visible = axes[0]
    for ok in axes[1:]:
        visible = (visible[:, None, :, None] & ok[None, :, None, :]).reshape(
            visible.shape[0] * ok.shape[0], -1
        )
    return jnp.asarray(visible)


# ---- Helpers -------------------------------------------------------------------------------------


def randn(seed, shape, dtype=jnp.float32):
    # numpy's generator: jax.random would compile a kernel per shape.
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def rel_error(x, ref):
    """Norm-wise ||x - ref|| / ||ref|| over ref's finite entries (absolute where ref is 0 there)."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert x.shape == ref.shape, (x.shape, ref.shape)
    finite = np.isfinite(ref)
    denom = np.linalg.norm(ref[finite])
    return float(np.linalg.norm(x[finite] - ref[finite]) / (denom if denom > 0 else 1.0))


def assert_close(x, ref, tol, name):
    x_np, ref_np = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert x_np.shape == ref_np.shape, f"{name}: shape {x_np.shape}, expected {ref_np.shape}"
    assert np.array_equal(np.isfinite(x_np), np.isfinite(ref_np)), f"{name}: non-finite entries differ"
    err = rel_error(x_np, ref_np)
    assert err <= tol, f"{name}: relative error {err:.3g} > {tol:g}"


def compare(fmha_fn, ref_fn, inputs: dict, *, tol=F32_TOL, grads=True, seed=100):
    """fmha_fn(**inputs) and ref_fn(**inputs) -> (out, lse); compares both, then the gradient of
    sum(out * w) + sum(lse * u) with respect to every floating input."""
    out, lse = jax.jit(fmha_fn)(**inputs)
    ref_out, ref_lse = jax.jit(ref_fn)(**{n: _f64(x) for n, x in inputs.items()})
    assert out.dtype == inputs["q"].dtype
    assert_close(out, ref_out, tol, "out")
    assert_close(lse, ref_lse, tol, "lse")
    if not grads:
        return
    w = randn(seed, out.shape, jnp.float64)
    u = randn(seed + 1, lse.shape, jnp.float64)

    def loss(fn, cast):
        def f(**xs):
            o, l_ = fn(**xs)
            l_ = jnp.where(jnp.isfinite(l_), l_, 0.0)
            return jnp.sum(o.astype(jnp.float64) * w) + jnp.sum(l_.astype(jnp.float64) * u)

        return lambda xs: f(**{n: cast(x) for n, x in xs.items()})

    names = [n for n, x in inputs.items() if jnp.issubdtype(x.dtype, jnp.floating)]
    diff = {n: inputs[n] for n in names}
    fixed = {n: x for n, x in inputs.items() if n not in names}
    got = jax.jit(jax.grad(lambda d: loss(fmha_fn, lambda x: x)({**d, **fixed})))(diff)
    ref64 = {n: _f64(x) for n, x in diff.items()}
    want = jax.jit(jax.grad(lambda d: loss(ref_fn, lambda x: x)({**d, **fixed})))(ref64)
    for n in names:
        assert got[n].dtype == inputs[n].dtype, n
        assert_close(got[n], want[n], tol, f"d{n}")


def qkv(B=2, Lq=9, Lk=13, H=4, Hkv=2, D=8, Dv=None, dtype=jnp.float32, seed=0):
    Dv = D if Dv is None else Dv
    return {
        "q": randn(seed, (B, Lq, H, D), dtype),
        "k": randn(seed + 1, (B, Lk, Hkv, D), dtype),
        "v": randn(seed + 2, (B, Lk, Hkv, Dv), dtype),
    }


# ---- Dense attention -----------------------------------------------------------------------------

DENSE_CASES = {
    "plain": {},
    "scale": {"scale": 0.3},
    "causal": {"causal": True},
    "causal_bottom_right": {"causal": True, "causal_alignment": "bottom_right"},
    "window": {"window": (3, 1)},
    "window_bottom_right_causal": {"window": (4, -1), "causal": True,
                                   "causal_alignment": "bottom_right"},
    "softcap": {"softcap": 2.0},
}


@pytest.mark.parametrize("case", list(DENSE_CASES))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64], ids=["f32", "f64"])
def test_dense_options(case, dtype):
    opts = DENSE_CASES[case]
    inputs = qkv(Lq=9, Lk=13, Dv=6, dtype=dtype)
    visible = mask_causal_window(9, 13, opts.get("causal", False),
                                 opts.get("causal_alignment") == "bottom_right",
                                 opts.get("window"))  # fmt: skip

    def ours(q, k, v):
        return fj.attention(q, k, v, return_lse=True, **opts)

    def ref(q, k, v):
        return reference(q, k, v, scale=opts.get("scale"), softcap=opts.get("softcap", 0.0),
                         visible=visible)  # fmt: skip

    compare(ours, ref, inputs, tol=F32_TOL if dtype == jnp.float32 else F64_TOL)


def test_dense_rows_without_keys():
    # bottom-right causal with Lq > Lk: the first queries see no key (out 0, lse -inf).
    inputs = qkv(Lq=12, Lk=5)
    visible = mask_causal_window(12, 5, True, True)

    def ours(q, k, v):
        return fj.attention(q, k, v, causal=True, causal_alignment="bottom_right", return_lse=True)

    out, lse = jax.jit(ours)(**inputs)
    assert np.isneginf(np.asarray(lse)[:, :, :7]).all() and not np.asarray(out)[:, :7].any()
    compare(ours, lambda q, k, v: reference(q, k, v, visible=visible), inputs)


@pytest.mark.parametrize("shape", [(4, 9, 13), (9, 13), (1, 4, 1, 13), (2, 4, 9, 13), (2, 1, 9, 1)],
                         ids=["H_Lq_Lk", "Lq_Lk", "1_H_1_Lk", "full", "B_1_Lq_1"])  # fmt: skip
def test_bias(shape):
    inputs = {**qkv(), "bias": randn(7, shape)}
    visible = mask_causal_window(9, 13, True)

    def ours(q, k, v, bias):
        return fj.attention(q, k, v, bias=bias, causal=True, return_lse=True)

    def ref(q, k, v, bias):
        return reference(q, k, v, bias=bias, visible=visible)

    compare(ours, ref, inputs)


@pytest.mark.parametrize("rel_batch", [2, 1], ids=["full", "broadcast"])
def test_rel_pos(rel_batch):
    Hk, Wk = 3, 4
    inputs = {**qkv(Lk=Hk * Wk), "rel_h": randn(8, (rel_batch, 4, 9, Hk)),
              "rel_w": randn(9, (rel_batch, 4, 9, Wk))}  # fmt: skip

    def ours(q, k, v, rel_h, rel_w):
        return fj.attention(q, k, v, rel_pos=(rel_h, rel_w), softcap=3.0, return_lse=True)

    def ref(q, k, v, rel_h, rel_w):
        return reference(q, k, v, rel_pos=(rel_h, rel_w), softcap=3.0)

    compare(ours, ref, inputs)


def test_sinks_extra_kv_and_gqa():
    inputs = {**qkv(H=6, Hkv=2, Dv=5), "sinks": randn(10, (6,)),
              "extra_k": randn(11, (2, 3, 2, 8)), "extra_v": randn(12, (2, 3, 2, 5))}  # fmt: skip
    visible = mask_causal_window(9, 13, True)

    def ours(q, k, v, sinks, extra_k, extra_v):
        return fj.attention(q, k, v, sinks=sinks, extra_kv=(extra_k, extra_v), causal=True,
                            return_lse=True)  # fmt: skip

    def ref(q, k, v, sinks, extra_k, extra_v):
        return reference(q, k, v, sinks=sinks, extra_kv=(extra_k, extra_v), visible=visible)

    compare(ours, ref, inputs)


def test_every_option_together_float64():
    inputs = {**qkv(dtype=jnp.float64, Lk=12), "bias": randn(7, (4, 1, 12), jnp.float64),
              "rel_h": randn(8, (2, 4, 9, 3), jnp.float64),
              "rel_w": randn(9, (2, 4, 9, 4), jnp.float64), "sinks": randn(10, (4,), jnp.float64)}
    visible = mask_causal_window(9, 12, True, True, (5, 0))

    def ours(q, k, v, bias, rel_h, rel_w, sinks):
        return fj.attention(q, k, v, bias=bias, rel_pos=(rel_h, rel_w), sinks=sinks, scale=0.4,
                            softcap=2.5, causal=True, causal_alignment="bottom_right",
                            window=(5, 0), return_lse=True)  # fmt: skip

    def ref(q, k, v, bias, rel_h, rel_w, sinks):
        return reference(q, k, v, bias=bias, rel_pos=(rel_h, rel_w), sinks=sinks, scale=0.4,
                         softcap=2.5, visible=visible)  # fmt: skip

    compare(ours, ref, inputs, tol=F64_TOL)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
def test_low_precision(dtype):
    inputs = qkv(dtype=dtype)

    def ours(q, k, v):
        return fj.attention(q, k, v, causal=True, return_lse=True)

    out, lse = jax.jit(ours)(**inputs)
    ref_out, ref_lse = reference(**inputs, visible=mask_causal_window(9, 13, True))
    assert out.dtype == dtype and lse.dtype == jnp.float32
    assert_close(out, ref_out, 2e-2, "out")
    assert_close(lse, ref_lse, 1e-3, "lse")


@pytest.mark.parametrize("options", [{"cpu_backend": "reference"}, {"deterministic": True},
                                     {"backward_impl": "split"}, {"backward_impl": "fused"}],
                         ids=["reference", "deterministic", "split", "fused"])  # fmt: skip
def test_backend_options(options):
    inputs = qkv()
    visible = mask_causal_window(9, 13, True)
    compare(lambda q, k, v: fj.attention(q, k, v, causal=True, return_lse=True, **options),
            lambda q, k, v: reference(q, k, v, visible=visible), inputs)  # fmt: skip


def test_deterministic_is_bitwise_reproducible():
    inputs = {**qkv(), "bias": randn(7, (4, 9, 13))}

    def grads(q, k, v, bias):
        def loss(q, k, v, bias):
            out, lse = fj.attention(q, k, v, bias=bias, causal=True, return_lse=True,
                                    deterministic=True)  # fmt: skip
            return jnp.sum(out * out) + jnp.sum(lse)

        return jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, bias)

    first, second = jax.jit(grads)(**inputs), jax.jit(grads)(**inputs)
    for a, b in zip(first, second):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_only_out_or_only_lse_differentiated():
    inputs = qkv()
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    ref_dq_out = jax.grad(lambda q: reference(q, _f64(k), _f64(v))[0].sum())(_f64(q))
    dq_out = jax.grad(lambda q: fj.attention(q, k, v).sum())(q)
    assert_close(dq_out, ref_dq_out, F32_TOL, "dq from out")
    ref_dq_lse = jax.grad(lambda q: reference(q, _f64(k), _f64(v))[1].sum())(_f64(q))
    dq_lse = jax.grad(lambda q: fj.attention(q, k, v, return_lse=True)[1].sum())(q)
    assert_close(dq_lse, ref_dq_lse, F32_TOL, "dq from lse")


def test_empty_sequences():
    out, lse = fj.attention(*qkv(Lq=0).values(), return_lse=True)
    assert out.shape == (2, 0, 4, 8) and lse.shape == (2, 4, 0)
    out = fj.attention(*qkv(Lk=0).values())
    assert out.shape == (2, 9, 4, 8) and not np.asarray(out).any()


# ---- Varlen --------------------------------------------------------------------------------------


def test_varlen():
    lens_q, lens_k = [3, 0, 6], [5, 2, 4]
    starts_q, starts_k = np.cumsum([0, *lens_q]).tolist(), np.cumsum([0, *lens_k]).tolist()
    cu_q, cu_k = jnp.asarray(starts_q, jnp.int32), jnp.asarray(starts_k, jnp.int32)
    H, Hkv, D = 4, 2, 8
    B = len(lens_q)
    inputs = {"q": randn(0, (sum(lens_q), H, D)), "k": randn(1, (sum(lens_k), Hkv, D)),
              "v": randn(2, (sum(lens_k), Hkv, D)), "sinks": randn(3, (H,)),
              "bias": randn(4, (B, H, max(lens_q), max(lens_k))),
              "extra_k": randn(5, (B, 2, Hkv, D)), "extra_v": randn(6, (B, 2, Hkv, D))}  # fmt: skip

    def ours(q, k, v, sinks, bias, extra_k, extra_v):
        return fj.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                   causal_alignment="bottom_right", sinks=sinks, bias=bias,
                                   extra_kv=(extra_k, extra_v), return_lse=True)  # fmt: skip

    def ref(q, k, v, sinks, bias, extra_k, extra_v):
        outs, lses = [], []
        for b in range(B):
            qs = q[starts_q[b] : starts_q[b + 1]][None]
            ks = k[starts_k[b] : starts_k[b + 1]][None]
            vs = v[starts_k[b] : starts_k[b + 1]][None]
            visible = mask_causal_window(lens_q[b], lens_k[b], True, True)
            o, l_ = reference(qs, ks, vs, sinks=sinks, visible=visible,
                              bias=bias[b : b + 1, :, : lens_q[b], : lens_k[b]],
                              extra_kv=(extra_k[b : b + 1], extra_v[b : b + 1]))  # fmt: skip
            outs.append(o[0])
            lses.append(l_[0])
        return jnp.concatenate(outs, 0), jnp.concatenate(lses, -1)

    compare(ours, ref, inputs)


def test_varlen_offsets_are_checked_when_the_call_runs():
    q = randn(0, (8, 2, 8))
    bad = jnp.asarray([0, 5, 3], jnp.int32)  # decreasing
    with pytest.raises(Exception, match="fmha: cu_seqlens_q"):
        jax.block_until_ready(fj.attention_varlen(q, q, q, bad, bad, 8, 8))


# ---- Neighborhood --------------------------------------------------------------------------------

NA_CASES = {
    "1d": (fj.na1d, (11,), {"kernel_size": 5, "dilation": 2}),
    "1d_causal": (fj.na1d, (10,), {"kernel_size": 3, "is_causal": True}),
    "2d": (fj.na2d, (5, 6), {"kernel_size": (3, 5), "dilation": (1, 1), "is_causal": (False, True)}),
    "3d": (fj.na3d, (3, 4, 6), {"kernel_size": 3, "dilation": (1, 1, 2)}),
}


@pytest.mark.parametrize("case", list(NA_CASES))
def test_neighborhood(case):
    fn, grid, opts = NA_CASES[case]
    n = len(grid)
    per_axis = lambda x: tuple(x) if isinstance(x, tuple) else (x,) * n  # noqa: E731
    visible = mask_neighborhood(grid, per_axis(opts["kernel_size"]),
                                per_axis(opts.get("dilation", 1)),
                                per_axis(opts.get("is_causal", False)))  # fmt: skip
    B, H, Hkv, D = 2, 4, 2, 8
    inputs = {"q": randn(0, (B, *grid, H, D)), "k": randn(1, (B, *grid, Hkv, D)),
              "v": randn(2, (B, *grid, Hkv, D)), "sinks": randn(3, (H,)),
              "extra_k": randn(4, (B, 3, Hkv, D)), "extra_v": randn(5, (B, 3, Hkv, D))}  # fmt: skip

    def ours(q, k, v, sinks, extra_k, extra_v):
        return fn(q, k, v, sinks=sinks, extra_kv=(extra_k, extra_v), return_lse=True, **opts)

    def ref(q, k, v, sinks, extra_k, extra_v):
        N = math.prod(grid)
        flat = [x.reshape(B, N, *x.shape[-2:]) for x in (q, k, v)]
        o, l_ = reference(*flat, sinks=sinks, extra_kv=(extra_k, extra_v), visible=visible)
        return o.reshape(B, *grid, H, D), l_.reshape(B, H, *grid)

    compare(ours, ref, inputs)


# ---- Merge ---------------------------------------------------------------------------------------


def test_merge_attentions():
    inputs = qkv(Lk=12)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    parts = [(0, 5), (5, 12)]

    def merged(q, k, v):
        outs, lses = zip(*(fj.attention(q, k[:, a:b], v[:, a:b], return_lse=True)
                           for a, b in parts))  # fmt: skip
        return fj.merge_attentions(list(outs), list(lses))

    compare(merged, lambda q, k, v: reference(q, k, v), inputs)
    # A part with lse -inf everywhere contributes nothing.
    out, lse = fj.attention(q, k, v, return_lse=True)
    empty = (jnp.zeros_like(out), jnp.full(lse.shape, -jnp.inf, jnp.float32))
    m_out, m_lse = fj.merge_attentions([out, empty[0]], [lse, empty[1]])
    assert_close(m_out, out, 1e-6, "out")
    assert_close(m_lse, lse, 1e-6, "lse")


# ---- Transformations -----------------------------------------------------------------------------


def test_vmap_over_extra_leading_axes():
    inputs = qkv()
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    qs = jnp.stack([q, q * 0.5, q * 2.0])
    sinks = randn(5, (4,))
    f = lambda q, k, v, s: fj.attention(q, k, v, sinks=s, causal=True)  # noqa: E731
    got = jax.jit(jax.vmap(f, in_axes=(0, None, None, None)))(qs, k, v, sinks)
    for i in range(3):
        assert_close(got[i], f(qs[i], k, v, sinks), 1e-6, f"vmap element {i}")
    # Nested vmap (two extra axes) and per-example gradients of an unbatched input (dsinks).
    got2 = jax.vmap(jax.vmap(f, in_axes=(0, None, None, None)), in_axes=(0, None, None, None))(
        jnp.stack([qs, qs]), k, v, sinks
    )
    assert_close(got2[1], got, 1e-6, "nested vmap")
    per_example = jax.vmap(jax.grad(lambda s, q: f(q, k, v, s).sum()), in_axes=(None, 0))(sinks, qs)
    for i in range(3):
        want = jax.grad(lambda s: f(qs[i], k, v, s).sum())(sinks)
        assert_close(per_example[i], want, 1e-6, f"dsinks of element {i}")
    summed = jax.grad(lambda s: jax.vmap(lambda q: f(q, k, v, s))(qs).sum())(sinks)
    assert_close(summed, per_example.sum(0), 1e-5, "dsinks summed over the vmapped axis")


def _loop_reference(f, in_axes, args):
    """f over the leading axis of the mapped args, one element at a time (no vmap)."""
    size = next(a.shape[0] for a, ax in zip(args, in_axes) if ax == 0)
    outs = [f(*(a[i] if ax == 0 else a for a, ax in zip(args, in_axes))) for i in range(size)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)


VMAP_CASES = {
    # name: (in_axes of q, k, v, bias, sinks), bias shape, sinks
    "q_only_bias_b1": ((0, None, None, None, None), (1, 4, 1, 13)),
    "kv_only_full_bias": ((None, 0, 0, None, None), (2, 4, 9, 13)),
    "all_batched_bias": ((0, 0, 0, 0, None), (1, 4, 9, 13)),
    "batched_sinks": ((0, None, None, None, 0), (4, 1, 13)),
}


@pytest.mark.parametrize("case", list(VMAP_CASES))
def test_vmap_folds_into_the_batch(case):
    in_axes, bias_shape = VMAP_CASES[case]
    size = 3
    q, k, v = qkv().values()
    args = [q, k, v, randn(20, bias_shape), randn(21, (4,))]
    args = [jnp.stack([a * (1 + 0.25 * i) for i in range(size)]) if ax == 0 else a
            for a, ax in zip(args, in_axes)]  # fmt: skip

    def f(q, k, v, bias, sinks):
        out, lse = fj.attention(q, k, v, bias=bias, sinks=sinks, causal=True, return_lse=True)
        return out, lse

    def loss(q, k, v, bias, sinks):  # uses lse too, so dlse reaches the backward
        out, lse = f(q, k, v, bias, sinks)
        return jnp.sum(out * out) + jnp.sum(jnp.sin(lse))

    grad = jax.grad(loss, argnums=(0, 1, 2, 3, 4))
    got = jax.jit(jax.vmap(f, in_axes=in_axes))(*args)
    want = _loop_reference(f, in_axes, args)
    for name, g, w in zip(("out", "lse"), got, want):
        assert_close(g, w, 1e-6, name)
    got = jax.jit(jax.vmap(grad, in_axes=in_axes))(*args)  # per-example gradients
    want = _loop_reference(grad, in_axes, args)
    for name, g, w in zip(("dq", "dk", "dv", "dbias", "dsinks"), got, want):
        assert_close(g, w, 1e-5, name)
    # The gradient of a vmapped loss: unbatched inputs receive the sum over the elements.
    summed = jax.jit(jax.grad(lambda *a: jax.vmap(loss, in_axes=in_axes)(*a).sum(),
                              argnums=(0, 1, 2, 3, 4)))(*args)  # fmt: skip
    for name, g, w, ax in zip(("dq", "dk", "dv", "dbias", "dsinks"), summed, want, in_axes):
        assert_close(g, w if ax == 0 else w.sum(0), 1e-5, name)
    # Folded: one forward call for the whole vmapped batch, no loop (except for vmapped sinks).
    text = jax.jit(jax.vmap(f, in_axes=in_axes)).lower(*args).as_text()
    assert text.count("fmha_attention_fwd") == 1
    assert ("while" in text) == (in_axes[4] == 0)


def test_vmap_neighborhood_and_merge():
    q = randn(0, (3, 2, 6, 5, 4, 8))  # vmapped axis of 3 over [B, X1, X2, H, D]
    f = lambda q: fj.na2d(q, q, q, kernel_size=3, return_lse=True)  # noqa: E731
    got, want = jax.vmap(f)(q), _loop_reference(f, (0,), [q])
    for name, g, w in zip(("out", "lse"), got, want):
        assert_close(g, w, 1e-6, name)
    g = jax.grad(lambda q: jax.vmap(f)(q)[0].sum())(q)
    assert_close(g, _loop_reference(jax.grad(lambda q: f(q)[0].sum()), (0,), [q]), 1e-5, "dq")
    out, lse = jax.vmap(f)(q)
    out, lse = out.reshape(3, 2, 30, 4, 8), lse.reshape(3, 2, 4, 30)  # merge takes [B, L, H, D]
    merge = jax.vmap(lambda o, l_: fj.merge_attentions([o, o * 2], [l_, l_]))
    m = merge(out, lse)
    assert_close(m[0], out * 1.5, 1e-6, "merged out")
    assert_close(m[1], lse + np.log(2.0), 1e-6, "merged lse")
    assert "while" not in jax.jit(merge).lower(out, lse).as_text()  # folded into the batch
    d = jax.grad(lambda o, l_: jnp.sum(merge(o, l_)[0] ** 2) + jnp.sum(merge(o, l_)[1]),
                 argnums=(0, 1))(out, lse)  # fmt: skip
    def loss(o, l_):
        m_out, m_lse = fj.merge_attentions([o, o * 2], [l_, l_])
        return jnp.sum(m_out**2) + jnp.sum(m_lse)

    want = _loop_reference(jax.grad(loss, argnums=(0, 1)), (0, 0), [out, lse])
    assert_close(d[0], want[0], 1e-6, "dout part")
    assert_close(d[1], want[1], 1e-6, "dlse part")


def test_shard_map_over_the_batch():
    # Two CPU devices need a fresh process (XLA_FLAGS is read when jax starts).
    code = """
import jax, jax.numpy as jnp, numpy as np
import fmha.jax as fj
from jax.sharding import Mesh, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("b",))
rng = np.random.default_rng(0)
q = jnp.asarray(rng.standard_normal((4, 16, 2, 8)), jnp.float32)
sinks = jnp.asarray(rng.standard_normal(2), jnp.float32)
f = lambda q, s: fj.attention(q, q, q, causal=True, sinks=s)
g = jax.shard_map(f, mesh=mesh, in_specs=(P("b"), P()), out_specs=P("b"), check_vma=False)
np.testing.assert_allclose(jax.jit(g)(q, sinks), f(q, sinks), rtol=0, atol=0)
grads = jax.jit(jax.grad(lambda q, s: g(q, s).sum(), argnums=(0, 1)))(q, sinks)
want = jax.grad(lambda q, s: f(q, s).sum(), argnums=(0, 1))(q, sinks)
for a, b in zip(grads, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
"""
    if not hasattr(jax, "shard_map"):
        pytest.skip("jax.shard_map needs a newer jax")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_package_root(), *sys.path]),
               XLA_FLAGS="--xla_force_host_platform_device_count=2")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)


def test_static_options_under_jit():
    q, k, v = qkv().values()
    f = jax.jit(fj.attention, static_argnames=("causal", "window", "scale"))
    assert_close(f(q, k, v, causal=True, window=(2, 0), scale=0.5),
                 fj.attention(q, k, v, causal=True, window=(2, 0), scale=0.5), 0, "out")
    with pytest.raises(TypeError, match="scale .*pass it as a static argument"):
        jax.jit(lambda q, s: fj.attention(q, k, v, scale=s))(q, 0.5)


# ---- Errors --------------------------------------------------------------------------------------


def test_errors_carry_the_library_message():
    q, k, v = qkv().values()
    with pytest.raises(ValueError, match=r"fmha: k has shape \[2, 13, 2, 5\]"):
        fj.attention(q, k[..., :5], v)
    with pytest.raises(ValueError, match="fmha: .*heads"):
        jax.jit(lambda q: fj.attention(q, k[:, :, :1].repeat(3, axis=2), v))(q)
    with pytest.raises(TypeError, match="dtype"):
        fj.attention(q, k.astype(jnp.bfloat16), v)
    with pytest.raises(TypeError, match="fmha: q has dtype int32"):
        fj.attention(q.astype(jnp.int32), k, v)
    with pytest.raises(ValueError, match="causal_alignment"):
        fj.attention(q, k, v, causal_alignment="bottom")
    with pytest.raises(ValueError, match="fmha: .*bias"):
        fj.attention(q, k, v, bias=jnp.zeros((3, 9, 13), jnp.float32))
    with pytest.raises(ValueError, match="kernel_size"):
        fj.na1d(q, k, v, kernel_size=(3, 3))
    with pytest.raises(TypeError, match="fmha: q must be an array, got str"):
        fj.attention("q", k, v)
    with pytest.raises(ValueError, match="merge_attentions got 2 outs and 1 lses"):
        fj.merge_attentions([q, q], [q])


def _package_root() -> str:
    """The directory that holds the fmha package (fmha/jax/__init__.py three levels down)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(fj.__file__))))


def test_import_does_not_import_torch():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_package_root(), *sys.path]))
    code = (
        "import sys, fmha.jax as fj, jax.numpy as jnp\n"
        "x = jnp.ones((1, 4, 2, 8), jnp.float32)\n"
        "fj.attention(x, x, x).block_until_ready()\n"
        "assert 'torch' not in sys.modules, 'fmha.jax imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
