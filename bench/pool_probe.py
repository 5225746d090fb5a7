"""Does a stream-ordered pool that returns its memory at every synchronisation show up in timed runs?

A diagnostic for the perf log, not a benchmark (no L2 flush, no peers, autograd's host path included):
SAM-B rel-pos backward and D 64 L 512 forward / backward, CUDA events, a synchronisation after every
run, first as the process starts, then with the device's default pool's release threshold raised.
An H100 ran it (2026-11-23) before fmha's backward took its workspace from a pool of its own
(src/cuda/workspace_pool.h): python bench/pool_probe.py
"""
import ctypes, glob, os, torch, fmha

def time_ms(fn, runs=30):
    ts = []
    for _ in range(runs):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2], ts[len(ts) // 10], ts[-len(ts) // 10 - 1]

def cases():
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s, sc=1.0: (torch.randn(*s, generator=g, device="cuda") * sc).to(torch.bfloat16)
    B, H, L, D = 8, 12, 4096, 64
    q, k, v = (r(B, L, H, D).requires_grad_() for _ in range(3))
    rh, rw = r(B, H, L, 64, sc=0.5).requires_grad_(), r(B, H, L, 64, sc=0.5).requires_grad_()
    o = fmha.attention(q, k, v, rel_pos=(rh, rw)); do = r(*o.shape)
    yield "SAM-B rel-pos bwd", lambda: torch.autograd.grad(o, (q, k, v, rh, rw), do, retain_graph=True)
    q2, k2, v2 = (r(32, 512, 32, 64).requires_grad_() for _ in range(3))
    o2 = fmha.attention(q2, k2, v2); do2 = r(*o2.shape)
    yield "D64 L512 bwd", lambda: torch.autograd.grad(o2, (q2, k2, v2), do2, retain_graph=True)
    yield "D64 L512 fwd", lambda: fmha.attention(q2, k2, v2)

lib = None
for name in ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]:
    try:
        lib = ctypes.CDLL(name); break
    except OSError:
        pass
if lib is None:
    cands = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcudart.so*"))
    lib = ctypes.CDLL(cands[0])
cs = list(cases())
for name, fn in cs:
    fn(); torch.cuda.synchronize()
    print("default pool  ", name, "median %.3f p10 %.3f p90 %.3f ms" % time_ms(fn))
pool = ctypes.c_void_p()
assert lib.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), 0) == 0
thr = ctypes.c_uint64(2**63)
assert lib.cudaMemPoolSetAttribute(pool, 4, ctypes.byref(thr)) == 0  # cudaMemPoolAttrReleaseThreshold
for name, fn in cs:
    fn(); torch.cuda.synchronize()
    print("threshold max ", name, "median %.3f p10 %.3f p90 %.3f ms" % time_ms(fn))
