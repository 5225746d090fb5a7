"""fmha.jax against JAX's own attention, in one process: jax.nn.dot_product_attention with
implementation="xla" and "cudnn", and the Pallas GPU flash attention of jax.experimental.pallas
(jax.experimental.pallas.ops.gpu.attention.mha), on the standard grid: head dims, sequence lengths
at a fixed number of tokens per batch, causal and not, forward and forward+backward.

    python bench/jax_attention.py                              # GPU if jax has one, else CPU (xla only)
    python bench/jax_attention.py --dims 128 --lens 4096 --direction fwd
    python bench/jax_attention.py --impls fmha,xla --device cpu --lens 256 --tokens 1024 --dtype float32

Each case runs jit-compiled, warmed up, then timed call by call (each call waits for its result:
the time includes the host's dispatch, which is what a training step pays); the median is
reported. --queued instead issues a round of calls back to back and waits once (the device's time
while dispatch keeps ahead, as fmha.bench's CUDA events measure it). TFLOP/s count only the visible score entries (causal: Lq (Lq + 1) / 2 of them): forward
4 B H Lq Lk D, backward 2.5 times that. Inputs are random normal, never zeros. An implementation
that cannot run a case (not installed, no GPU, refused shape) prints the reason in its row.

--features times the cases where fmha.jax fuses what the peers must materialise: SAM's
decomposed relative positions (fmha's rel_pos against jax.nn.dot_product_attention given the
expanded [B, H, L, L] bias) and 2-D neighborhood attention (fmha's na2d against the peers given
the boolean [L, L] mask of the same neighborhoods); each row also gives the largest difference of
fmha's forward from the XLA peer's. --overhead times a tiny jitted call of fmha.jax against a
jitted elementwise op on the same array: the difference bounds what fmha's FFI call adds to JAX's
own dispatch from above (it also holds the tiny attention's own run time).

    python bench/jax_attention.py --features
    python bench/jax_attention.py --features --smoke --device cpu --impls fmha,xla --dtype float32
    python bench/jax_attention.py --overhead

JAX preallocates most of the GPU's memory at start; this script turns that off (unless
XLA_PYTHON_CLIENT_PREALLOCATE is set) so that the implementations allocate alike.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fmha.jax as fj  # noqa: E402

IMPLS = ("fmha", "cudnn", "xla", "pallas")


def _pallas_mha():
    from jax.experimental.pallas.ops.gpu import attention

    return attention.mha


def attention_fn(impl: str, causal: bool, head_dim: int):
    """(q, k, v) -> out for one implementation, [B, L, H, D] in and out."""
    scale = 1.0 / float(np.sqrt(head_dim))
    if impl == "fmha":
        return lambda q, k, v: fj.attention(q, k, v, causal=causal)
    if impl in ("xla", "cudnn"):
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, scale=scale, is_causal=causal, implementation=impl
        )
    if impl == "pallas":
        mha = _pallas_mha()
        return lambda q, k, v: mha(q, k, v, segment_ids=None, sm_scale=scale, causal=causal)
    raise ValueError(f"unknown implementation {impl!r}; known: {', '.join(IMPLS)}")


def step(fn, direction: str):
    if direction == "fwd":
        return jax.jit(fn)

    def loss(q, k, v):
        return jnp.sum(fn(q, k, v).astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def median_ms(run, args, warmup: int, iters: int, queued: bool = False) -> float:
    """Median ms of a call: each call timed alone, waiting for its result (the host's dispatch
    included), or with queued, the mean of `iters` calls issued back to back and waited for once,
    median of 5 such rounds (the device's time when dispatch keeps ahead of it)."""
    for _ in range(warmup):
        jax.block_until_ready(run(*args))
    times = []
    for _ in range(5 if queued else iters):
        start = time.perf_counter()
        if queued:
            for _ in range(iters - 1):
                run(*args)
        jax.block_until_ready(run(*args))
        times.append((time.perf_counter() - start) * 1e3 / (iters if queued else 1))
    return statistics.median(times)


def flops(batch, heads, length, head_dim, causal: bool, direction: str) -> float:
    visible = length * (length + 1) / 2 if causal else length * length
    forward = 4.0 * batch * heads * visible * head_dim
    return forward if direction == "fwd" else forward * 3.5


def neighborhood_mask(grid: tuple[int, int], kernel: int) -> np.ndarray:
    """The [L, L] boolean mask of 2-D neighborhood attention over a row-major grid (SPEC §6: the
    window of K keys starts at clamp(p - K/2, 0, n - K) on each axis)."""
    axes = []
    for n in grid:
        pos = np.arange(n)
        start = np.clip(pos - kernel // 2, 0, n - kernel)
        axes.append((pos[None, :] >= start[:, None]) & (pos[None, :] < start[:, None] + kernel))
    rows, cols = axes
    return (rows[:, None, :, None] & cols[None, :, None, :]).reshape(grid[0] * grid[1], -1)


# (name, batch, heads, (grid height, width), head dim, what: "rel-pos" or an NA kernel size)
FEATURE_CASES = (
    ("rel-pos SAM-B", 8, 12, (64, 64), 64, "rel-pos"),
    ("rel-pos SAM-H", 8, 16, (64, 64), 80, "rel-pos"),
    ("NA 2-D 7x7", 8, 4, (64, 64), 64, 7),
    ("NA 2-D 13x13", 8, 4, (64, 64), 64, 13),
    ("NA 2-D 13x13 128^2", 1, 4, (128, 128), 64, 13),
)


def feature_fns(impl: str, what, grid, head_dim):
    """(inputs -> out) of a feature case for one implementation, and the inputs it takes from
    (q, k, v, rel_h, rel_w): fmha gets the factors, the peers the expanded bias or the mask."""
    scale = 1.0 / float(np.sqrt(head_dim))
    height, width = grid
    if impl == "fmha":
        if what == "rel-pos":
            return lambda q, k, v, rh, rw: fj.attention(q, k, v, rel_pos=(rh, rw))
        shape = lambda x: x.reshape(x.shape[0], height, width, *x.shape[2:])  # noqa: E731
        return lambda q, k, v, rh, rw: fj.na2d(shape(q), shape(k), shape(v), what).reshape(q.shape)
    if impl not in ("xla", "cudnn"):
        raise ValueError(f"{impl} has no form of this case")
    if what == "rel-pos":
        def run(q, k, v, rh, rw):
            # bias[b, h, i, (y, x)] = rel_h[b, h, i, y] + rel_w[b, h, i, x]
            bias = (rh[..., :, None] + rw[..., None, :]).reshape(*rh.shape[:3], height * width)
            return jax.nn.dot_product_attention(q, k, v, bias=bias, scale=scale, implementation=impl)
        return run
    mask = jnp.asarray(neighborhood_mask(grid, what))[None, None]
    return lambda q, k, v, rh, rw: jax.nn.dot_product_attention(
        q, k, v, mask=mask, scale=scale, implementation=impl)


def run_features(args, device, dtype, impls) -> None:
    print("| case | direction | " + " | ".join(f"{i} ms (TFLOP/s)" for i in impls)
          + " | fmha - xla, forward |")  # fmt: skip
    print("|---|---|" + "---|" * (len(impls) + 1))
    rng = np.random.default_rng(0)
    for name, batch, heads, grid, head_dim, what in FEATURE_CASES:
        if args.smoke:  # the same cases on an 8 x 8 grid, one batch entry: the script runs
            batch, grid, what = 1, (8, 8), what if what == "rel-pos" else min(what, 5)
        length = grid[0] * grid[1]
        put = lambda *shape: jax.device_put(  # noqa: E731
            jnp.asarray(rng.standard_normal(shape), dtype), device)
        inputs = (put(batch, length, heads, head_dim), put(batch, length, heads, head_dim),
                  put(batch, length, heads, head_dim), put(batch, heads, length, grid[0]),
                  put(batch, heads, length, grid[1]))  # fmt: skip
        visible = length * length if what == "rel-pos" else float(neighborhood_mask(grid, what).sum())
        forward_flops = 4.0 * batch * heads * visible * head_dim
        diff = "n/a"
        for direction in args.direction.split(","):
            cells, outs = [], {}
            for impl in impls:
                try:
                    fn = feature_fns(impl, what, grid, head_dim)
                    run = jax.jit(fn) if direction == "fwd" else jax.jit(jax.grad(
                        lambda *a, fn=fn: jnp.sum(fn(*a).astype(jnp.float32)), argnums=(0, 1, 2)))
                    ms = median_ms(run, inputs, args.warmup, args.iters, args.queued)
                    if direction == "fwd":
                        outs[impl] = np.asarray(jax.jit(fn)(*inputs), np.float32)
                    flops_run = forward_flops * (1.0 if direction == "fwd" else 3.5)
                    cells.append(f"{ms:.3f} ({flops_run / ms / 1e9:.3g})")
                except Exception as e:  # noqa: BLE001 - a row per refusal: the reason, shortened
                    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                    cells.append(f"n/a: {reason[:60]}")
            if "fmha" in outs and "xla" in outs:
                diff = f"{np.max(np.abs(outs['fmha'] - outs['xla'])):.2e}"
            shown = diff if direction == "fwd" else ""
            print(f"| {name} | {direction} | " + " | ".join(cells) + f" | {shown} |", flush=True)


def run_overhead(args, device, dtype) -> None:
    """A tiny call: fmha.jax's attention and a jitted elementwise op on the same array, each
    timed call by call as the main table is; the difference bounds the FFI call's own cost (it
    includes the attention's run time, a few microseconds at this size)."""
    shape = (1, 16, 1, 64)
    x = jax.device_put(jnp.asarray(np.random.default_rng(0).standard_normal(shape), dtype), device)
    iters = max(args.iters, 2000)
    fmha_us = median_ms(jax.jit(lambda q: fj.attention(q, q, q)), (x,), 50, iters) * 1e3
    op_us = median_ms(jax.jit(lambda q: q * 2), (x,), 50, iters) * 1e3
    print(f"tiny call {shape}, median of {iters}: fmha.jax attention {fmha_us:.1f} us, "
          f"jitted x * 2 {op_us:.1f} us, difference {fmha_us - op_us:.1f} us")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("gpu", "cpu"), default=None, help="default: jax's default backend")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--dims", default="64,128,256")
    p.add_argument("--lens", default="1024,2048,4096,8192,16384")
    p.add_argument("--tokens", type=int, default=16384, help="batch x sequence length of every case")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--causal", default="0,1", help="which of non-causal (0) and causal (1) to run")
    p.add_argument("--direction", default="fwd,fwd+bwd")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--features", action="store_true", help="SAM rel-pos and NA 2-D instead of the grid")
    p.add_argument("--overhead", action="store_true", help="the FFI call's own time on a tiny call")
    p.add_argument("--queued", action="store_true",
                   help="time calls issued back to back (device time) instead of one by one")
    p.add_argument("--smoke", action="store_true", help="--features on tiny grids (CPU check of the script)")
    args = p.parse_args(argv)

    device = jax.devices(args.device)[0] if args.device else jax.devices()[0]
    dtype = jnp.dtype(args.dtype)
    impls = [i for i in args.impls.split(",") if i]
    grid_shape = "" if args.features or args.overhead else f", H {args.heads}, {args.tokens} tokens per case"
    print(f"# {datetime.date.today()} jax {jax.__version__} fmha {fj.__version__} on {device.device_kind}"
          f" ({device.platform}), {args.dtype}{grid_shape}")
    if args.overhead:
        run_overhead(args, device, dtype)
        return
    if args.features:
        run_features(args, device, dtype, [i for i in impls if i != "pallas"])
        return
    print("| D | L | causal | direction | " + " | ".join(f"{i} ms (TFLOP/s)" for i in impls) + " |")
    print("|---|---|---|---|" + "---|" * len(impls))
    rng = np.random.default_rng(0)
    for head_dim in (int(d) for d in args.dims.split(",")):
        for length in (int(n) for n in args.lens.split(",")):
            batch = max(args.tokens // length, 1)
            shape = (batch, length, args.heads, head_dim)
            q, k, v = (jax.device_put(jnp.asarray(rng.standard_normal(shape), dtype), device)
                       for _ in range(3))  # fmt: skip
            for causal in (bool(int(c)) for c in args.causal.split(",")):
                for direction in args.direction.split(","):
                    cells = []
                    for impl in impls:
                        try:
                            run = step(attention_fn(impl, causal, head_dim), direction)
                            ms = median_ms(run, (q, k, v), args.warmup, args.iters, args.queued)
                            tflops = flops(batch, args.heads, length, head_dim, causal, direction) / ms / 1e9
                            cells.append(f"{ms:.3f} ({tflops:.3g})")
                        except Exception as e:  # a row per refusal: the reason, shortened
                            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                            cells.append(f"n/a: {reason[:60]}")
                    print(f"| {head_dim} | {length} | {int(causal)} | {direction} | " + " | ".join(cells) + " |",
                          flush=True)


if __name__ == "__main__":
    main()
