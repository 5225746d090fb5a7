"""Context parallelism: fmha.distributed (ring and all-gather forms, zigzag layout) against
PyTorch's own context parallelism (torch.distributed.tensor.experimental.context_parallel around
SDPA) on the same shapes, one process per GPU. Reports, per form and direction:

- per-GPU TFLOP/s (FLOPs over visible score entries only, fwd = 4 B H S^2/2 D for causal,
  fwd+bwd = 3.5x that, divided by the GPU count), the slowest rank's median time;
- scaling efficiency: that throughput over single-GPU fmha.attention's on a causal sequence of
  S / sqrt(W) tokens (the same visible entries per GPU), run on every GPU at once;
- communication hidden: with t_full the timed call, t_compute the same call with every transfer
  replaced by nothing (the blocks compute on buffers that were not filled) and t_comm the same
  call with every attention kernel replaced by nothing, hidden = (t_compute + t_comm - t_full)
  / t_comm (1: all of it overlapped, 0: none);
- the peers: 'torch_cp' (context_parallel around SDPA with --sdpa-backend, K/V heads repeated to
  H for GQA: its ring ops take equal heads) and 'allgather_sdpa' (K/V all-gathered, each zigzag
  query chunk against its visible keys by SDPA with a lower-right causal mask, which SDPA runs on
  its flash or efficient backends only, so those replace cuDNN there; backward reduce-scatters
  dK/dV), each under a watchdog that prints every rank's stack when a run takes
  longer than --peer-timeout seconds, after a probe at --probe-seq tokens.

    torchrun --nproc-per-node 2 bench/context_parallel.py                     # the issue's grid
    torchrun --nproc-per-node 4 bench/context_parallel.py --seq-lens 131072,524288 --json cp4.json
    torchrun --nproc-per-node 2 bench/context_parallel.py --device cpu --smoke  # the script runs

--json PATH writes every row (rank 0). The CPU run (gloo, fmha's CPU backend) only checks that
the script works and that every path agrees with fmha.distributed (--check): its times mean
nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import faulthandler
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fmha
import fmha.distributed as cp

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ---- Timing --------------------------------------------------------------------------------------


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device: str, warmup: int, repeats: int, grad: bool = True) -> float:
    """The slowest rank's median of `repeats` calls; ranks start each call together (barrier).
    grad=False: under torch.no_grad() (forward timings: nothing kept for a backward)."""
    if not grad:
        with torch.no_grad():
            return time_ms(fn, device, warmup, repeats)
    for _ in range(warmup):
        fn()
    _sync(device)
    samples = []
    for _ in range(repeats):
        dist.barrier()
        _sync(device)
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    mine = torch.tensor([statistics.median(samples)], dtype=torch.float64,
                        device=device if device == "cuda" else "cpu")  # fmt: skip
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine.item())


def causal_flops(B: int, H: int, S: int, D: int, direction: str) -> float:
    """FLOPs over visible entries of causal attention: 2 matmuls of 2 D each per entry forward,
    3.5x that forward + backward (the convention of fmha.bench.flops)."""
    fwd = 2 * B * H * (S * (S + 1) // 2) * (D + D)
    return fwd * (1.0 if direction == "fwd" else 3.5)


# ---- Stand-ins that take one half away (communication or compute) --------------------------------


class _NoTransfers:
    """torch.distributed as fmha.distributed sees it, with its transfers doing nothing."""

    def __getattr__(self, name):
        return getattr(dist, name)

    @staticmethod
    def batch_isend_irecv(ops):
        return []

    @staticmethod
    def all_gather_into_tensor(output, tensor, group=None, async_op=False):
        return None

    @staticmethod
    def reduce_scatter_tensor(output, tensor, op=None, group=None, async_op=False):
        return None


class _NoKernels:
    """fmha's attention ops as fmha.distributed sees them, computing nothing (right shapes)."""

    _ops = cp._ops

    def __getattr__(self, name):
        return getattr(self._ops, name)

    @staticmethod
    def forward(layout, q, k, v, layout_args, options, *, fake):
        out = q.new_zeros((*q.shape[:-1], v.shape[-1]))
        return out, torch.zeros(q.shape[0], q.shape[2], q.shape[1], device=q.device)

    @staticmethod
    def backward(layout, dout, dlse, q, k, v, *rest, **kwargs):
        return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)) + (None,) * 6


@contextlib.contextmanager
def replaced(module, name: str, stand_in):
    original = getattr(module, name)
    setattr(module, name, stand_in)
    try:
        yield
    finally:
        setattr(module, name, original)


# ---- The measured calls --------------------------------------------------------------------------


def fmha_call(q, k, v, dout, form: str, lengths, direction: str):
    def run():
        out = cp.attention(q, k, v, layout="zigzag", form=form, lengths=lengths, causal=True)
        if direction != "fwd":
            q.grad = k.grad = v.grad = None
            out.backward(dout)
        return out

    return run


class _AllGatherSeq(torch.autograd.Function):
    """[B, H, n_r, D] shards -> the whole [B, H, S, D] in sequence order; backward reduce-scatters.
    index: for every position of the sequence, its row in the gathered [W * longest] buffer."""

    @staticmethod
    def forward(ctx, x, index, longest, world):
        ctx.index, ctx.longest, ctx.world, ctx.rows = index, longest, world, x.shape[2]
        rows = x.permute(2, 0, 1, 3)
        padded = rows.new_zeros((longest, *rows.shape[1:]))
        padded[: rows.shape[0]] = rows
        out = rows.new_empty((world * longest, *rows.shape[1:]))
        dist.all_gather_into_tensor(out, padded)
        return out.index_select(0, index).permute(1, 2, 0, 3)

    @staticmethod
    def backward(ctx, grad):
        rows = grad.permute(2, 0, 1, 3)
        padded = rows.new_zeros((ctx.world * ctx.longest, *rows.shape[1:]))
        padded.index_copy_(0, ctx.index, rows)
        mine = rows.new_empty((ctx.longest, *rows.shape[1:]))
        dist.reduce_scatter_tensor(mine, padded)
        return mine[: ctx.rows].permute(1, 2, 0, 3), None, None, None


def gather_index(segs, device) -> torch.Tensor:
    longest = max(sum(n for _, n in rs) for rs in segs)
    index = torch.empty(sum(n for rs in segs for _, n in rs), dtype=torch.int64)
    for r, rs in enumerate(segs):
        row = r * longest
        for start, n in rs:
            index[start : start + n] = torch.arange(row, row + n)
            row += n
    return index.to(device)


def allgather_sdpa_call(q, k, v, dout, segs, direction: str, backend):
    """q [B, H, n, D], k/v [B, Hkv, n, D] zigzag shards (heads repeated by the caller)."""
    from torch.nn.attention.bias import causal_lower_right

    longest = max(sum(n for _, n in rs) for rs in segs)
    index = gather_index(segs, q.device)
    mine = segs[dist.get_rank()]

    def run():
        kf = _AllGatherSeq.apply(k, index, longest, len(segs))
        vf = _AllGatherSeq.apply(v, index, longest, len(segs))
        outs, off = [], 0
        with backend():
            for start, n in mine:
                end = start + n  # the chunk's queries see keys 0 .. end - 1, lower-right causal
                qc = q[:, :, off : off + n]
                mask = causal_lower_right(n, end)
                outs.append(F.scaled_dot_product_attention(qc, kf[:, :, :end], vf[:, :, :end],
                                                           attn_mask=mask))  # fmt: skip
                off += n
        out = torch.cat(outs, 2)
        if direction != "fwd":
            q.grad = k.grad = v.grad = None
            out.backward(dout)
        return out

    return run


def sdpa_backend(name: str, device: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if device != "cuda":
        return contextlib.nullcontext
    by_name = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip
    chosen = [by_name[part] for part in name.split("+")]
    return lambda: sdpa_kernel(chosen)


# ---- One shape -----------------------------------------------------------------------------------


def rows_for(args, device, S, H, Hkv, D, dtype, log):
    world, rank = dist.get_world_size(), dist.get_rank()
    B = args.batch
    segs = cp.layout_segments(S, world, "zigzag")
    lengths = ([sum(n for _, n in rs) for rs in segs],) * 2
    local = lengths[0][rank]
    g = torch.Generator(device=device).manual_seed(1234 + rank)

    def rand(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype)

    q = rand(B, local, H, D).requires_grad_()
    k = rand(B, local, Hkv, D).requires_grad_()
    v = rand(B, local, Hkv, D).requires_grad_()
    dout = rand(B, local, H, D)
    rows = []
    base = dict(world=world, S=S, B=B, H=H, Hkv=Hkv, D=D, dtype=str(dtype)[6:], causal=True,
                device=torch.cuda.get_device_name() if device == "cuda" else "cpu")  # fmt: skip

    # Single-GPU fmha at the same visible entries per GPU, on every GPU at once.
    S1 = S / math.sqrt(world)
    S1 = max(1, round(S1 / 128) * 128 if S >= 1024 else round(S1))
    q1, k1, v1 = (rand(B, S1, h, D).requires_grad_() for h in (H, Hkv, Hkv))
    dout1 = rand(B, S1, H, D)
    single = {}
    for direction in args.directions:
        def run1(direction=direction):
            out = fmha.attention(q1, k1, v1, causal=True)
            if direction != "fwd":
                q1.grad = k1.grad = v1.grad = None
                out.backward(dout1)

        ms = time_ms(run1, device, args.warmup, args.repeats, direction != "fwd")
        single[direction] = causal_flops(B, H, S1, D, direction) / (ms * 1e-3) / 1e12
        rows.append(dict(base, impl="fmha single GPU", form="-", direction=direction, S=S1, ms=ms,
                         tflops_per_gpu=single[direction]))  # fmt: skip
        log(rows[-1])
    del q1, k1, v1, dout1

    reference = None
    for form in args.forms:
        for direction in args.directions:
            call = fmha_call(q, k, v, dout, form, lengths, direction)
            grad = direction != "fwd"
            ms = time_ms(call, device, args.warmup, args.repeats, grad)
            with replaced(cp, "dist", _NoTransfers()):
                ms_compute = time_ms(call, device, args.warmup, args.repeats, grad)
            with replaced(cp, "_ops", _NoKernels()):
                ms_comm = time_ms(call, device, args.warmup, args.repeats, grad)
            tflops = causal_flops(B, H, S, D, direction) / world / (ms * 1e-3) / 1e12
            hidden = (ms_compute + ms_comm - ms) / ms_comm if ms_comm > 0 else float("nan")
            rows.append(dict(base, impl="fmha.distributed", form=form, direction=direction, ms=ms,
                             tflops_per_gpu=tflops, scaling=tflops / single[direction],
                             ms_compute_only=ms_compute, ms_comm_only=ms_comm,
                             comm_hidden=max(0.0, min(1.0, hidden))))  # fmt: skip
            log(rows[-1])
        if args.check and reference is None:
            with torch.no_grad():
                reference = cp.attention(q, k, v, layout="zigzag", form=form, lengths=lengths,
                                         causal=True).float()  # fmt: skip

    # Peers: [B, H, S, D] layout, K/V heads repeated to H (their ring ops take equal heads).
    groups = H // Hkv
    qt = q.detach().transpose(1, 2).contiguous().requires_grad_()
    kt = k.detach().repeat_interleave(groups, 2).transpose(1, 2).contiguous().requires_grad_()
    vt = v.detach().repeat_interleave(groups, 2).transpose(1, 2).contiguous().requires_grad_()
    doutt = dout.transpose(1, 2).contiguous()
    backend = sdpa_backend(args.sdpa_backend, device)
    for peer in args.peers:
        for direction in args.directions:
            label = f"{peer} ({args.sdpa_backend})"
            try:
                if peer == "allgather_sdpa":
                    # A query chunk against its key prefix needs a lower-right causal mask, which
                    # SDPA runs on flash or efficient only (CausalBias): for cuDNN it would
                    # materialise the [n, end] mask. So this peer runs flash/efficient then.
                    ag_backend = args.sdpa_backend
                    if ag_backend == "cudnn":
                        ag_backend = "flash+efficient"
                    label = f"{peer} ({ag_backend})"
                    call = allgather_sdpa_call(qt, kt, vt, doutt, segs, direction,
                                               sdpa_backend(ag_backend, device))  # fmt: skip
                    grad = direction != "fwd"

                    def measure():
                        return time_ms(call, device, args.warmup, args.repeats, grad), call()

                else:

                    def measure():
                        return torch_cp(args, device, segs, qt, kt, vt, doutt, direction, backend)

                ms, out = _watched(args, label, measure)
                tflops = causal_flops(B, H, S, D, direction) / world / (ms * 1e-3) / 1e12
                row = dict(base, impl=label, form="-", direction=direction, ms=ms,
                           tflops_per_gpu=tflops, scaling=tflops / single[direction])  # fmt: skip
                if reference is not None:
                    row["max_diff_vs_fmha"] = float((out.detach().transpose(1, 2).float()
                                                     - reference).abs().max())  # fmt: skip
            except Exception as e:  # noqa: BLE001 (a peer that fails is a result)
                error = f"{type(e).__name__}: {e}"[:300]
                row = dict(base, impl=label, direction=direction, error=error)
            rows.append(row)
            log(row)
    return rows


def _watched(args, label, fn):
    """fn() with every rank's stack printed if it runs past --peer-timeout (a hang shows where)."""
    faulthandler.dump_traceback_later(args.peer_timeout, repeat=True, file=sys.stderr)
    try:
        return fn()
    finally:
        faulthandler.cancel_dump_traceback_later()


_MESH = None


def torch_cp(args, device, segs, q, k, v, dout, direction, backend):
    """PyTorch's context parallelism: the whole q/k/v on every rank, sharded in place (head-tail
    load balance, the same zigzag as fmha.distributed's) by context_parallel, SDPA inside."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    global _MESH
    if _MESH is None:  # one mesh for the run (each init_device_mesh may make process groups)
        _MESH = init_device_mesh(device, (dist.get_world_size(),))
    mesh = _MESH
    # context_parallel shards its buffers itself: give it the whole sequences (rebuilt from
    # every rank's zigzag shard, so that both libraries see the same values).
    full = [cp.unshard(t.detach(), layout="zigzag", dim=2) for t in (q, k, v)]
    grad = cp.unshard(dout, layout="zigzag", dim=2)
    buffers = [*full, grad]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2, 2],
                          no_restore_buffers=set(buffers)):  # fmt: skip
        qs, ks, vs = (b.requires_grad_() for b in buffers[:3])

        def run():
            with backend():
                out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
                if direction != "fwd":
                    qs.grad = ks.grad = vs.grad = None
                    out.backward(buffers[3])
            return out

        ms = time_ms(run, device, args.warmup, args.repeats, direction != "fwd")
        out = run()
    return ms, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--seq-lens", default="131072,524288", help="total sequence lengths")
    parser.add_argument("--heads", default="32/8,16/16", help="H/Hkv pairs")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    parser.add_argument("--forms", default="ring,allgather")
    parser.add_argument("--directions", default="fwd,fwd+bwd")
    parser.add_argument("--peers", default="torch_cp,allgather_sdpa")
    parser.add_argument("--sdpa-backend", default="cudnn", choices=["cudnn", "flash", "efficient"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--peer-timeout", type=float, default=300.0)
    parser.add_argument("--probe-seq", type=int, default=8192,
                        help="each peer first runs at this length (0: no probe)")
    parser.add_argument("--check", action="store_true",
                        help="report each peer's max |diff| from fmha")  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU smoke run)")
    parser.add_argument("--json", default=None)
    if parser.parse_known_args()[0].smoke:  # other defaults; arguments given still win
        parser.set_defaults(seq_lens="96,130", heads="4/2,2/2", head_dim=16, dtype="float32",
                            repeats=2, warmup=1, probe_seq=0, check=True)  # fmt: skip
    args = parser.parse_args()
    args.forms = [f for f in args.forms.split(",") if f]
    args.directions = [d for d in args.directions.split(",") if d]
    args.peers = [p for p in args.peers.split(",") if p]

    device = args.device
    if device == "cuda":
        # One GPU per process: without this every rank would use GPU 0, and NCCL hangs.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = datetime.timedelta(seconds=max(600, 2 * args.peer_timeout))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=timeout)
    rank = dist.get_rank()

    def log(row):
        if rank == 0:
            shown = {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in row.items()}
            print(json.dumps(shown), flush=True)

    if rank == 0:
        print(f"# {datetime.date.today()} torch {torch.__version__} fmha {fmha.__version__} "
              f"world {dist.get_world_size()} device {device}", flush=True)  # fmt: skip
    rows = []
    dtype = DTYPES[args.dtype]
    for pair in args.heads.split(","):
        H, Hkv = (int(x) for x in pair.split("/"))
        if args.probe_seq:
            probe = argparse.Namespace(**{**vars(args), "forms": [], "repeats": 2, "warmup": 1})
            probe_rows = rows_for(probe, device, args.probe_seq, H, Hkv, args.head_dim, dtype,
                                  lambda r: None)  # fmt: skip
            for row in probe_rows:
                row["probe"] = True
                rows.append(row)
                log(row)
        for S in (int(s) for s in args.seq_lens.split(",")):
            rows += rows_for(args, device, S, H, Hkv, args.head_dim, dtype, log)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    dist.barrier()  # no rank tears its connections down while another still uses them
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
