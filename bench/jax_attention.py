"""fmha.jax against JAX's own attention, in one process: jax.nn.dot_product_attention with
implementation="xla" and "cudnn", and the Pallas GPU flash attention of jax.experimental.pallas
(jax.experimental.pallas.ops.gpu.attention.mha), on the standard grid: head dims, sequence lengths
at a fixed number of tokens per batch, causal and not, forward and forward+backward.

    python bench/jax_attention.py                              # GPU if jax has one, else CPU (xla only)
    python bench/jax_attention.py --dims 128 --lens 4096 --direction fwd
    python bench/jax_attention.py --impls fmha,xla --device cpu --lens 256 --tokens 1024 --dtype float32

Each case runs jit-compiled, warmed up, then timed call by call (each call waits for its result:
the time includes the host's dispatch, which is what a training step pays); the median is
reported. TFLOP/s count only the visible score entries (causal: Lq (Lq + 1) / 2 of them): forward
4 B H Lq Lk D, backward 2.5 times that. Inputs are random normal, never zeros. An implementation
that cannot run a case (not installed, no GPU, refused shape) prints the reason in its row.

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


def median_ms(run, args, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(run(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(run(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def flops(batch, heads, length, head_dim, causal: bool, direction: str) -> float:
    visible = length * (length + 1) / 2 if causal else length * length
    forward = 4.0 * batch * heads * visible * head_dim
    return forward if direction == "fwd" else forward * 3.5


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
    args = p.parse_args(argv)

    device = jax.devices(args.device)[0] if args.device else jax.devices()[0]
    dtype = jnp.dtype(args.dtype)
    impls = [i for i in args.impls.split(",") if i]
    print(f"# {datetime.date.today()} jax {jax.__version__} fmha {fj.__version__} on {device.device_kind}"
          f" ({device.platform}), {args.dtype}, H {args.heads}, {args.tokens} tokens per case")
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
                            ms = median_ms(run, (q, k, v), args.warmup, args.iters)
                            tflops = flops(batch, args.heads, length, head_dim, causal, direction) / ms / 1e9
                            cells.append(f"{ms:.3f} ({tflops:.3g})")
                        except Exception as e:  # a row per refusal: the reason, shortened
                            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                            cells.append(f"n/a: {reason[:60]}")
                    print(f"| {head_dim} | {length} | {int(causal)} | {direction} | " + " | ".join(cells) + " |",
                          flush=True)


if __name__ == "__main__":
    main()
