"""Host time of one attention call: what a call costs the CPU before its kernels run.

A loop of calls on a problem whose kernels are short (B 1, H 1, L 128, D 64, bf16 on CUDA), without
synchronising inside the loop, runs as fast as the host can issue the calls: the time a call then
is the host's. Compared with PyTorch SDPA's flash backend on the same inputs, and split into layers
of fmha: the public function (fmha.attention: on plain tensors the eager path since 2026-11-27,
an autograd.Function around the op's body), the custom op itself (torch.library's dispatcher and
autograd wrapper: what torch.compile and dispatch modes run), the op's body without either
(fmha._attention_ops.forward), and the C++ entry alone (fmha._C.run on prepared views:
validation, dispatch and the CUDA launcher). Forward only, then forward + backward of the public
function.

    python bench/host_overhead.py            # CUDA if present, else CPU (the CPU backend computes)
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import fmha
from fmha import _attention_ops as ops
from fmha import _bridge


def per_call_us(fn, calls: int = 2000, device: str = "cuda") -> float:
    for _ in range(100):
        fn()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v = (torch.randn(1, 128, 1, 64, device=device, dtype=dtype) for _ in range(3))
    options = ops.Options(None, None, None, None, None, None, None, 0.0, True, False, -1, -1,
                          False, "auto", False)  # fmt: skip
    params = ops._Dense.forward_params()
    params.q, params.k, params.v = (_bridge.view(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    params.options = ops._c_options(options, None, None, None, planned=False)
    out = torch.empty_like(q)
    lse = torch.empty(1, 1, 128, device=device, dtype=torch.float32)
    params.out, params.lse = _bridge.view(out, "out"), _bridge.view(lse, "lse")
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0

    rows = [
        ("fmha.attention (causal)", lambda: fmha.attention(q, k, v, causal=True)),
        ("the custom op (compiled path)", lambda: ops.attention_fwd(q, k, v, *options)),
        ("op body", lambda: ops.forward(ops._Dense, q, k, v, (), options, fake=False)),
        ("C++ entry (_C.run)", lambda: fmha._C.run(params, stream)),
    ]
    if device == "cuda":
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

        def sdpa():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

        rows.append(("sdpa flash (causal)", sdpa))
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"host time per call, {device} ({name}), B1 H1 L128 D64 {dtype}")
    for label, fn in rows:
        print(f"  {label:28s} {per_call_us(fn, device=device):8.1f} us")
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def fwd_bwd():
        fmha.attention(qg, kg, vg, causal=True).sum().backward()

    print(f"  {'fmha fwd+bwd (+sum)':28s} {per_call_us(fwd_bwd, 500, device):8.1f} us")


if __name__ == "__main__":
    main()
