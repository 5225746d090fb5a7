"""Host time of one attention call: what a call costs the CPU besides the attention itself.

Each variant is called many times, in rounds that take every variant in turn (so a busy spell of a
shared machine hits them alike), and the median of the per-call times is reported. The layers of
fmha are timed apart:

- `fmha.attention`: the public function (on plain tensors the eager path: an autograd.Function
  around the op's body), under torch.no_grad() and with inputs that require grad;
- the custom op itself (torch.library's dispatcher and autograd wrapper: what dispatch modes,
  tensor subclasses and torch.jit.trace run, and inside a compiled graph the dispatcher alone) and
  the op's body without either (`fmha._attention_ops.forward`);
- the C++ entry alone (`fmha._C.run` on views prepared once): validation, dispatch and the
  backend's work, which on CPU tensors is the attention itself; and its validation alone
  (`fmha._C.check`), the part of the entry's host time that is not the backend's;
- forward + backward (`torch.autograd.grad` of the public function's output), and the C++
  backward alone on prepared views (and its validation alone).

The Python layers' own cost is a variant's time minus the C++ entry's time inside it. On CUDA
(bf16) nothing synchronises inside a call, so a loop of calls whose kernels are short runs as fast
as the host issues them and the time is the host's; PyTorch SDPA's flash backend is timed beside.
The `issue` column is each loop's time until its last call returned, before the closing
synchronisation: the host's time alone, below the call's time where the GPU set the pace.
bench/cpp/host_call_costs.cu prices the CUDA calls that the C++ entries make.
On CPU the C++ entry computes, and `--threads 1` with `--clock thread` (CPU seconds of the calling
thread) keeps other processes of a shared machine out of the figures.

    python bench/host_overhead.py                              # CUDA if present: B1 H1 L128 D64
    python bench/host_overhead.py --device cpu --shape 1,8,128,64 --threads 1 --clock thread
    python bench/host_overhead.py --device cpu --shape 1,8,128,64 --python-only   # no C++ call
    python bench/host_overhead.py --device cpu --shape 1,8,128,64 --profile   # cProfile's top
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import fmha
from fmha import _attention_ops as ops
from fmha import _bridge


class _Twice(torch.autograd.Function):
    """x * 2 as a Python Function; its backward first calls `inside` when one is given."""

    @staticmethod
    def forward(ctx, x, inside=None):
        ctx.inside = inside
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        if ctx.inside is not None:
            ctx.inside()
        return grad * 2, None


def measure(variants: dict, rounds: int, calls: int, clock, sync) -> tuple[dict, dict]:
    """Median per-call microseconds of each variant: `rounds` rounds, each timing `calls` calls of
    every variant in turn (a warm-up round first). Two figures: up to the round's closing
    synchronisation (the call's time), and up to the last call's return (the host's issue time:
    below the first where the GPU, not the host, set the pace)."""
    samples = {name: [] for name in variants}
    issued = {name: [] for name in variants}
    for r in range(rounds + 1):
        for name, fn in variants.items():
            sync()
            start = clock()
            for _ in range(calls):
                fn()
            returned = clock()
            sync()
            if r:
                samples[name].append((clock() - start) / calls / 1e3)
                issued[name].append((returned - start) / calls / 1e3)
    def medians(by_name):
        return {name: statistics.median(values) for name, values in by_name.items()}
    return medians(samples), medians(issued)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shape", default="1,1,128,64", help="B,H,L,D (default 1,1,128,64)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"),
                   help="default bf16 on CUDA, fp32 on CPU")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (the CPU backend's threads)")
    p.add_argument("--clock", choices=("wall", "thread"), default="wall",
                   help="wall: perf_counter_ns; thread: the calling thread's CPU time (CPU, with "
                        "--threads 1)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=20, help="calls a round (forward + backward: half)")
    p.add_argument("--python-only", action="store_true",
                   help="fmha's calls run everything but the C++ entry (fmha._bridge.run_shaped "
                        "returns at once): the Python layers' own time, without subtracting")
    p.add_argument("--profile", action="store_true",
                   help="print cProfile's top functions of forward and of forward + backward")
    args = p.parse_args()
    device = args.device
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        args.dtype or ("bf16" if device == "cuda" else "fp32")]
    B, H, L, D = (int(x) for x in args.shape.split(","))
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, dout = (torch.randn(B, L, H, D, generator=gen).to(device, dtype) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    options = ops.Options(None, None, None, None, None, None, None, 0.0, True, False, -1, -1,
                          False, "auto", False)  # fmt: skip

    # The C++ calls alone, on views prepared once: the forward, then the backward of its output.
    params = ops._Dense.forward_params()
    params.q, params.k, params.v = (_bridge.view(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    params.options = ops._c_options(options, None, None, None, planned=False)
    out = torch.empty(B, L, H, D, device=device, dtype=dtype)
    lse = torch.empty(B, H, L, device=device, dtype=torch.float32)
    params.out, params.lse = _bridge.view(out, "out"), _bridge.view(lse, "lse")
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0
    _bridge.raise_for_status(fmha._C.run(params, stream))
    bparams = ops._Dense.backward_params()
    bparams.q, bparams.k, bparams.v = params.q, params.k, params.v
    bparams.out, bparams.lse = params.out, params.lse
    bparams.dout = _bridge.view(dout, "dout")
    bparams.options = params.options
    grads = fmha._C.AttentionGradients()
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    grads.dq, grads.dk, grads.dv = (_bridge.view(t, n) for t, n in ((dq, "dq"), (dk, "dk"),
                                                                     (dv, "dv")))
    bparams.grads = grads
    _bridge.raise_for_status(fmha._C.run(bparams, stream))

    if args.python_only:
        _bridge.run = _bridge.run_shaped = lambda params, device: None

    def public_no_grad():
        with torch.no_grad():
            return fmha.attention(q, k, v, causal=True)

    def fwd_bwd():
        o = fmha.attention(qg, kg, vg, causal=True)
        return torch.autograd.grad(o, (qg, kg, vg), dout)

    forward_rows = {
        "fmha.attention, no_grad": public_no_grad,
        "fmha.attention, requires_grad": lambda: fmha.attention(qg, kg, vg, causal=True),
        "the custom op, no grad": lambda: ops.attention_fwd(q, k, v, *options),
        "the custom op, requires_grad": lambda: ops.attention_fwd(qg, kg, vg, *options),
        "op body (ops.forward)": lambda: ops.forward(ops._Dense, q, k, v, (), options,
                                                     fake=False),
        "C++ forward alone (_C.run)": lambda: fmha._C.run(params, stream),
        "C++ validation alone (_C.check)": lambda: fmha._C.check(params),
    }
    if device == "cuda":
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

        def sdpa():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

        forward_rows["sdpa flash (causal)"] = sdpa

    def bodies_fwd_bwd():  # the ops' bodies back to back: fmha's work without the autograd engine
        o, lse_ = ops.forward(ops._Dense, q, k, v, (), options, fake=False)
        return ops.backward(ops._Dense, dout, None, q, k, v, o, lse_, (), (), options, fake=False)

    backward_rows = {
        "fmha fwd+bwd (autograd.grad)": fwd_bwd,
        "op bodies fwd+bwd, no autograd": bodies_fwd_bwd,
        "C++ backward alone (_C.run)": lambda: fmha._C.run(bparams, stream),
        "C++ backward validation (_C.check)": lambda: fmha._C.check(bparams),
        # The autograd engine's own cost: a one-kernel op's forward and backward, as torch's op and
        # as a Python autograd.Function (whose backward runs on the engine's device thread on CUDA,
        # holding the GIL); then that Function with the C++ backward called inside its backward.
        "x * 2 fwd+bwd (autograd.grad)": lambda: torch.autograd.grad(qg * 2, (qg,), dout),
        "Function x * 2 fwd+bwd": lambda: torch.autograd.grad(_Twice.apply(qg), (qg,), dout),
        "Function x * 2, C++ backward inside": lambda: torch.autograd.grad(
            _Twice.apply(qg, lambda: fmha._C.run(bparams, stream)), (qg,), dout),
    }
    if device == "cuda":
        qgt, kgt, vgt, doutt = (t.transpose(1, 2) for t in (qg, kg, vg, dout))

        def sdpa_fwd_bwd(backend):
            def fn():
                with torch.nn.attention.sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(qgt, kgt, vgt, is_causal=True)
                return torch.autograd.grad(o, (qg, kg, vg), doutt)
            return fn

        backends = torch.nn.attention.SDPBackend
        backward_rows["sdpa flash fwd+bwd (autograd.grad)"] = sdpa_fwd_bwd(backends.FLASH_ATTENTION)
        backward_rows["sdpa cudnn fwd+bwd (autograd.grad)"] = sdpa_fwd_bwd(
            backends.CUDNN_ATTENTION)
    if args.profile:
        import cProfile
        import pstats

        for label, fn in (("forward, requires_grad", forward_rows["fmha.attention, requires_grad"]),
                          ("forward + backward", fwd_bwd)):
            for _ in range(20):
                fn()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(500):
                fn()
            prof.disable()
            print(f"== cProfile, {label}, 500 calls (tottime: the function's own time)")
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        return

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    clock = time.thread_time_ns if args.clock == "thread" else time.perf_counter_ns
    fwd, fwd_issued = measure(forward_rows, args.rounds, args.calls, clock, sync)
    bwd, bwd_issued = measure(backward_rows, args.rounds, max(args.calls // 2, 1), clock, sync)
    issued = {**fwd_issued, **bwd_issued}
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"host time per call, {device} ({name}), torch {torch.__version__}, B{B} H{H} L{L} D{D} "
          f"{dtype}, causal, {torch.get_num_threads()} thread(s), {args.clock} clock, median of "
          f"{args.rounds} rounds of {args.calls} calls")
    if device == "cuda":
        print(f"  {'':34s} {'call':>9s}    {'issue':>9s}  (issue: until the calls returned, "
              "before the sync)")
    for label, us in {**fwd, **bwd}.items():
        extra = f"    {issued[label]:9.1f} us" if device == "cuda" else ""
        print(f"  {label:34s} {us:9.1f} us{extra}")
    cxx_f, cxx_b = fwd["C++ forward alone (_C.run)"], bwd["C++ backward alone (_C.run)"]
    if args.python_only:
        print("  (--python-only: the rows of fmha's functions and ops are their Python layers "
              "alone; the C++ rows run the C++ entry)")
        return
    print("  Python layers (the call minus the C++ entry's time):")
    print(f"    forward, no_grad                 {fwd['fmha.attention, no_grad'] - cxx_f:9.1f} us")
    print(f"    forward, requires_grad           "
          f"{fwd['fmha.attention, requires_grad'] - cxx_f:9.1f} us")
    print(f"    forward + backward               "
          f"{bwd['fmha fwd+bwd (autograd.grad)'] - cxx_f - cxx_b:9.1f} us")


if __name__ == "__main__":
    main()
