"""Per-kernel device time of one fmha call, forward and backward, from torch.profiler: which kernel
of a split backward (preprocess, dK/dV, dQ, conversions) takes the time. A diagnostic for the
perf log, not a benchmark (no L2 flush, no peers): python bench/profile_kernels.py --case sam-b-rel

Cases name a shape and its options; see CASES below."""
import argparse
import collections

import torch

import fmha

CASES = {
    # SAM-B global attention: B 8, H 12, 64 x 64 tokens, D 64.
    "sam-b": dict(B=8, H=12, L=4096, D=64),
    "sam-b-rel": dict(B=8, H=12, L=4096, D=64, rel=(64, 64)),
    "sam-h-rel": dict(B=8, H=16, L=4096, D=80, rel=(64, 64)),
    "sam-b-bias": dict(B=8, H=12, L=4096, D=64, bias=True),
    "sam-b-dbias": dict(B=8, H=12, L=4096, D=64, bias=True, dbias=True),
    # The standard suite's dense shapes (16k tokens, hidden 2048): the D 64 / 128 / 256 kernels alone.
    "dense-d64": dict(B=4, H=32, L=4096, D=64),
    "dense-d64-causal": dict(B=4, H=32, L=4096, D=64, causal=True),
    "dense-d128": dict(B=4, H=16, L=4096, D=128),
    "dense-d128-causal": dict(B=4, H=16, L=4096, D=128, causal=True),
    "dense-d256": dict(B=2, H=8, L=8192, D=256),
    "dense-d256-causal": dict(B=2, H=8, L=8192, D=256, causal=True),
    # Short rows, where the forward trails cuDNN most (16k tokens as above).
    "dense-d64-causal-l1024": dict(B=16, H=32, L=1024, D=64, causal=True),
    "dense-d128-l512": dict(B=32, H=16, L=512, D=128),
    # Issue 4's fp32 case (the sm80 kernels on tf32 tensor cores, exact by default).
    "fp32": dict(B=4, H=16, L=2048, D=64, dtype=torch.float32),
    # Issue 5's neighborhood cases at D 64 (H = 1024 / D).
    "na1d-k2047": dict(B=1, H=16, D=64, grid=(32768,), kernel=(2047,)),
    "na2d-k13": dict(B=8, H=16, D=64, grid=(64, 64), kernel=(13, 13)),
    "na3d-k7": dict(B=2, H=16, D=64, grid=(16, 32, 32), kernel=(7, 7, 7)),
}


def inputs(c):
    dtype = c.get("dtype", torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    B, H, D = c["B"], c["H"], c["D"]
    tokens = tuple(c["grid"]) if "grid" in c else (c["L"],)
    L = c.get("L")
    q, k, v = (randn(B, *tokens, H, D).requires_grad_() for _ in range(3))
    kw = {}
    leaves = [q, k, v]
    if "rel" in c:
        hk, wk = c["rel"]
        rel_h = randn(B, H, L, hk, scale=0.5).requires_grad_()
        rel_w = randn(B, H, L, wk, scale=0.5).requires_grad_()
        kw["rel_pos"] = (rel_h, rel_w)
        leaves += [rel_h, rel_w]
    if c.get("bias"):
        bias = randn(1, H, L, L)
        if c.get("dbias"):
            bias.requires_grad_()
            leaves.append(bias)
        kw["bias"] = bias
    if "grid" in c:
        kw["kernel_size"] = c["kernel"]
    if c.get("causal"):
        kw["causal"] = True
    return q, k, v, kw, leaves, randn(B, *tokens, H, D)


def call(q, k, v, kw, deterministic=False):
    if "kernel_size" in kw:
        if not deterministic:
            return getattr(fmha, f"na{q.dim() - 3}d")(q, k, v, **kw)
        # na*d take no deterministic flag; the op does (it forces the split backward).
        dims = q.dim() - 3
        o = fmha._api._options(None, False, "top_left", None, None, None, 0.0, None, None, True,
                               False)  # fmt: skip
        out, _ = fmha._api._ops.neighborhood_fwd(q, k, v, list(kw["kernel_size"]), [1] * dims,
                                                 [False] * dims, *o)  # fmt: skip
        return out
    return fmha.attention(q, k, v, deterministic=deterministic, **kw)


def with_backward_impl(kw, impl):
    return kw if impl == "auto" else dict(kw, backward_impl=impl)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="sam-b-rel", choices=sorted(CASES))
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--deterministic", action="store_true",
                    help="deterministic=True (the split backward: a dQ kernel, no atomics)")
    ap.add_argument("--backward-impl", default="auto", choices=["auto", "fused", "split"],
                    help="the backward's structure (dense attention only)")
    ap.add_argument("--forward-only", action="store_true", help="no backward")
    ap.add_argument("--no-profiler", action="store_true",
                    help="only run the calls (under Nsight Compute: scripts/ncu-kernels.sh)")
    args = ap.parse_args()
    q, k, v, kw, leaves, dout = inputs(CASES[args.case])
    kw = with_backward_impl(kw, args.backward_impl)

    def step():
        with torch.set_grad_enabled(not args.forward_only):
            out = call(q, k, v, kw, args.deterministic)
        if not args.forward_only:
            torch.autograd.grad(out, leaves, dout)

    for _ in range(2):  # warm-up (lazy allocations, first launches)
        step()
    torch.cuda.synchronize()
    if args.no_profiler:
        for _ in range(args.iters):
            step()
        torch.cuda.synchronize()
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.iters):
            step()
        torch.cuda.synchronize()
    total = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name] += e.device_time / args.iters  # microseconds per iteration
    what = "forward" if args.forward_only else "forward + backward"
    how = (" deterministic" if args.deterministic else "") + (
        f" backward_impl={args.backward_impl}" if args.backward_impl != "auto" else "")
    print(f"{args.case}{how} ({torch.cuda.get_device_name()}): device time per {what}")
    for name, us in sorted(total.items(), key=lambda x: -x[1])[:12]:
        print(f"{us / 1000:9.3f} ms  {name[:110]}")


if __name__ == "__main__":
    main()
