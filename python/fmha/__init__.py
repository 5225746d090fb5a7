"""fmha: exact, memory-efficient fused attention, forward and backward, for PyTorch.

Tensors use the [batch, sequence, heads, head_dim] layout. Models that keep [B, H, L, D] pass
``q.transpose(1, 2)``: strided views go to the C++ layer as they are, without a copy (any strides,
including 0 for broadcast batch/sequence/head dims, as long as the last dimension has stride 1;
an input whose last dimension is not contiguous is copied once). Every function works on CPU
tensors (a fast, multi-threaded backend for dense and varlen attention in float32 / float16 /
bfloat16, and the float64-accumulating reference for everything else, including float64 inputs so
gradients can be checked by finite differences; ``set_cpu_backend("reference")`` runs every CPU call
on the reference) and CUDA tensors (run on torch's current stream), supports
autograd for every tensor input, and compiles under ``torch.compile(fullgraph=True)``.

Example::

    import torch, fmha

    B, H, L, D = 2, 8, 1024, 64
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    # [B, H, L, D] tensors: pass [B, L, H, D] views, get out [B, L, H, D] back.
    out = fmha.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    out.transpose(1, 2).sum().backward()

    # A bias in any shape that broadcasts to [B, H, Lq, Lk]; its gradient keeps that shape.
    bias = torch.randn(H, 1, L, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, lse = fmha.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                              bias=bias, return_lse=True)

    # 2-D neighborhood attention on a 32 x 32 grid, 7 x 7 window.
    x = torch.randn(B, 32, 32, H, D, device="cuda", dtype=torch.bfloat16)
    y = fmha.na2d(x, x, x, kernel_size=7)

Errors: invalid arguments raise ValueError (TypeError for a dtype, or an argument of the wrong
type) with a message that names the argument, before anything is allocated or computed; a valid
call that the backend cannot run raises NotImplementedError naming the backend and the feature.

JAX: ``fmha.jax`` offers the same functions for jax.Array inputs (docs/jax.md); importing it
never imports torch.

Building: ``pip install .`` builds the C++ library and the extension fmha._C (CUDA backend when
nvcc is found). For a CPU-only build: ``pip install -C cmake.define.FMHA_ENABLE_CUDA=OFF .``
(or ``FMHA_ENABLE_CUDA=OFF pip install .``).
"""

import sys as _sys

# The PyTorch API and the extension fmha._C load together with torch, which comes first (it loads
# torch's CUDA runtime before the extension). When torch is already imported they load here, as
# any torch user expects (its custom ops registered on `import fmha`); otherwise on the first use
# of one of their names. So `import fmha.jax`, which runs this file first, never imports torch,
# and the JAX front end (fmha.jax) works without torch installed.
_TORCH_API = (
    "attention",
    "attention_varlen",
    "na1d",
    "na2d",
    "na3d",
    "merge_attentions",
    "attention_with_kvcache",
    "built_with_cuda",
    "set_cpu_backend",
    "get_cpu_backend",
    "__version__",
)
__all__ = [name for name in _TORCH_API if name != "__version__"]


def _load_torch_api() -> None:
    import torch  # noqa: F401  (loads torch's CUDA runtime before the extension)

    from . import _C, _api, _backend, _kv_cache

    def built_with_cuda() -> bool:
        """True when the installed extension contains the CUDA backend."""
        return _C.built_with_cuda()

    globals().update(
        attention=_api.attention,
        attention_varlen=_api.attention_varlen,
        na1d=_api.na1d,
        na2d=_api.na2d,
        na3d=_api.na3d,
        merge_attentions=_api.merge_attentions,
        attention_with_kvcache=_kv_cache.attention_with_kvcache,
        built_with_cuda=built_with_cuda,
        set_cpu_backend=_backend.set_cpu_backend,
        get_cpu_backend=_backend.get_cpu_backend,
        __version__=_C.version(),
    )


def __getattr__(name: str):
    if name in _TORCH_API:
        _load_torch_api()
        return globals()[name]
    raise AttributeError(f"module 'fmha' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_TORCH_API})


if "torch" in _sys.modules:
    _load_torch_api()
