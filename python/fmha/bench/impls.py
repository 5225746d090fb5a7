"""The implementations a case is timed with: fmha and its peers.

Each implementation turns a case's common-layout inputs into a `Prepared` problem in its own native
layout (the conversion happens here, outside the timed region) or raises `NotAvailable` with the
reason it cannot run the case. Peers get no help they would not get in a real model: options
without a native equivalent are emulated the way users do it (a materialised mask) or refused.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from . import masks
from .cases import Case
from .reference import TORCH_DTYPES, grad_names, materialized_attention, score_bytes


class NotAvailable(Exception):
    """This implementation cannot run this case; the message says why."""


@dataclasses.dataclass
class Prepared:
    forward: Callable[[dict], torch.Tensor]  # native inputs by name -> output (native layout)
    inputs: dict  # native-layout inputs; those in `leaves` require grad
    leaves: dict  # name -> native-layout leaf tensor that receives a gradient
    dout: torch.Tensor  # output gradient in the native layout
    to_common: Callable[[str, torch.Tensor], torch.Tensor]  # native -> common layout, by name
    note: str = ""  # how the implementation was run, when it is not the obvious way (reports)

    def __post_init__(self):
        # Inference runs get tensors that do not require grad (same storage), as a model under
        # torch.no_grad() would pass; some implementations refuse requires_grad inputs otherwise.
        self.inference_inputs = {n: v.detach() for n, v in self.inputs.items()}

    def run(self, grad: bool) -> torch.Tensor:
        return self.forward(self.inputs if grad else self.inference_inputs)


@dataclasses.dataclass
class Settings:
    """Knobs shared by the implementations (set from the command line)."""
    device: str = "cpu"
    materialize_limit_bytes: int = 1 << 30  # largest fp32 score matrix naive / sdpa-math may build
    mask_limit_elements: int = 1 << 28  # largest [Lq, Lk] bool mask an SDPA peer may be given
    flex_on_cpu: bool = False
    flex_dynamic: object = False  # torch.compile(dynamic=...) for flex_attention (--flex-dynamic)
    backward_impl: str = "auto"  # fmha's backward_impl, or "both" for fmha-fused and fmha-split


_LAYOUT_NAMES = ("q", "k", "v", "out")


def _identity_layout(case: Case, t: dict):
    return (lambda name, x: x), (lambda name, x: x)


def _bhld_layout(case: Case, t: dict):
    """[B, L, H, D] (NA: [B, X.., H, D]; varlen: [T, H, D] as one batch) <-> [B, H, L, D]."""
    shapes = {"q": t["q"].shape, "k": t["k"].shape, "v": t["v"].shape, "out": t["dout"].shape}

    def to_native(name, x):
        if name not in _LAYOUT_NAMES:
            return x
        if case.kind == "varlen":
            x = x[None]
        return x.reshape(x.shape[0], -1, x.shape[-2], x.shape[-1]).transpose(1, 2).contiguous()

    def to_common(name, x):
        if name not in _LAYOUT_NAMES:
            return x
        return x.transpose(1, 2).reshape(shapes[name])

    return to_native, to_common


def _prepare_leaves(case: Case, t: dict, layout) -> tuple:
    """Native-layout copies of the inputs; those in grad_names(case) require grad."""
    to_native, to_common = layout(case, t)
    wanted = grad_names(case)
    native = {}
    for name, x in t.items():
        if name in ("dout", "cu_seqlens"):
            continue
        y = to_native(name, x.detach()).clone()
        native[name] = y.requires_grad_() if name in wanted else y
    leaves = {name: native[name] for name in wanted}
    return native, leaves, to_native("out", t["dout"]).contiguous(), to_common


class Impl:
    name = ""
    is_peer = True

    def __init__(self, settings: Settings):
        self.settings = settings

    def prepare(self, case: Case, t: dict) -> Prepared:
        raise NotImplementedError


class Fmha(Impl):
    """fmha's own entry points (CUDA kernels, or the CPU backend on CPU tensors)."""
    is_peer = False

    def __init__(self, settings: Settings, backward_impl: str, name: str = "fmha"):
        super().__init__(settings)
        self.backward_impl = backward_impl
        self.name = name

    def prepare(self, case, t):
        try:
            import fmha
        except ImportError as e:
            raise NotAvailable(f"import fmha failed: {e}") from None
        x, leaves, dout, to_common = _prepare_leaves(case, t, _identity_layout)

        def options(x):
            kw = {"backward_impl": self.backward_impl}
            if case.causal:
                kw["causal"] = True
            if case.window is not None:
                kw["window"] = tuple(case.window)
            if case.bias:
                kw["bias"] = x["bias"]
            if case.rel_pos is not None:
                kw["rel_pos"] = (x["rel_h"], x["rel_w"])
            if case.softcap > 0:
                kw["softcap"] = case.softcap
            if case.sinks:
                kw["sinks"] = x["sinks"]
            return kw
        if case.kind == "varlen":
            cu, longest = t["cu_seqlens"], max(case.seqlens)

            def forward(x):
                return fmha.attention_varlen(x["q"], x["k"], x["v"], cu, cu, longest, longest,
                                             **options(x))
        elif case.kind == "na":
            na = getattr(fmha, f"na{len(case.grid)}d")

            def forward(x):
                return na(x["q"], x["k"], x["v"], kernel_size=tuple(case.kernel),
                          dilation=tuple(case.dilation), is_causal=tuple(case.na_causal),
                          **options(x))
        else:
            def forward(x):
                return fmha.attention(x["q"], x["k"], x["v"], **options(x))
        return Prepared(forward, x, leaves, dout, to_common)


class Naive(Impl):
    """Scores materialised in the input dtype, softmax in fp32: what a plain PyTorch model does."""
    name = "naive"

    def prepare(self, case, t):
        _check_materialize(case, self.settings)
        x, leaves, dout, to_common = _prepare_leaves(case, t, _identity_layout)

        def forward(x):
            return materialized_attention(case, x, softmax_dtype=torch.float32)
        return Prepared(forward, x, leaves, dout, to_common)


def _check_materialize(case: Case, settings: Settings):
    need = score_bytes(case, 4)
    if case.kind == "decode":  # the naive GQA expands K and V to every query head
        need += case.B * case.Lk * case.H * (case.D + case.dv) * t_itemsize(case)
    if need > settings.materialize_limit_bytes:
        raise NotAvailable(f"would materialise {need / 2**30:.1f} GiB of fp32 scores "
                           f"(limit {settings.materialize_limit_bytes / 2**30:.1f} GiB)")


def _dense_bool_mask(case: Case, device, rows_per_chunk: int = 1024) -> torch.Tensor:
    """[Lq, Lk] visibility, built in row chunks so the int64 index arithmetic stays small."""
    cols = torch.arange(case.Lk, device=device)[None, :]
    return torch.cat([masks.visible(case, torch.arange(r0, min(r0 + rows_per_chunk, case.Lq),
                                                       device=device)[:, None], cols)
                      for r0 in range(0, case.Lq, rows_per_chunk)])


class Sdpa(Impl):
    """torch.nn.functional.scaled_dot_product_attention with one backend forced."""

    def __init__(self, settings: Settings, backend_name: str):
        super().__init__(settings)
        from torch.nn.attention import SDPBackend
        self.backend = getattr(SDPBackend, backend_name)
        self.name = "sdpa-" + {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient",
                               "CUDNN_ATTENTION": "cudnn", "MATH": "math"}[backend_name]

    def prepare(self, case, t):
        from torch.nn.attention import sdpa_kernel
        if self.settings.device == "cpu" and self.name in ("sdpa-efficient", "sdpa-cudnn"):
            raise NotAvailable("PyTorch has no CPU kernel for this SDPA backend")
        if case.kind == "varlen":
            raise NotAvailable("no packed variable-length input (dense SDPA would pad)")
        if case.softcap > 0:
            raise NotAvailable("SDPA has no softcap")
        if case.sinks:
            raise NotAvailable("SDPA has no sink logits")
        if self.name == "sdpa-math":
            _check_materialize(case, self.settings)
        x, leaves, dout, to_common = _prepare_leaves(case, t, _bhld_layout)
        # Masks SDPA cannot express natively become one materialised [Lq, Lk] bool mask, built
        # once here, as a model would cache it; is_causal is used when it is the only mask.
        bool_mask = None
        use_is_causal = case.causal and case.kind == "dense" and case.window is None
        if masks.has_mask(case) and not use_is_causal:
            if case.Lq * case.Lk > self.settings.mask_limit_elements:
                raise NotAvailable(f"would materialise a {case.Lq}x{case.Lk} mask "
                                   f"(limit {self.settings.mask_limit_elements} elements)")
            bool_mask = _dense_bool_mask(case, t["q"].device)
        # A fixed bias (no gradient) is merged with the mask once here; a learned one per call.
        fixed_bias = None if case.bias_grad else x.get("bias")
        if fixed_bias is not None and bool_mask is not None:
            fixed_bias = fixed_bias.masked_fill(~bool_mask, float("-inf"))
            bool_mask = None
        gqa = case.H != case.hkv
        backend = self.backend
        note = ""
        if case.kind == "decode" and gqa:
            gqa, note = self._decode_heads(case, x, backend)

        def forward(x):
            bias = x["bias"] if case.bias_grad else fixed_bias
            if case.bias_grad and bool_mask is not None:
                bias = bias.masked_fill(~bool_mask, float("-inf"))
            mask = bias if bias is not None else bool_mask
            if case.rel_pos is not None:  # SAM's decomposed rel-pos, materialised as SAM does
                b, h, lq, hk = x["rel_h"].shape
                rel = (x["rel_h"][..., :, None] + x["rel_w"][..., None, :]).view(b, h, lq, -1)
                mask = rel if mask is None else rel + mask
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(x["q"], x["k"], x["v"], attn_mask=mask,
                                                      is_causal=use_is_causal, enable_gqa=gqa)
        return Prepared(forward, x, leaves, dout, to_common, note=note)

    def _decode_heads(self, case, x, backend) -> tuple:
        """GQA in decode: enable_gqa (K and V read once a group) where the backend takes it;
        otherwise K and V expanded to every query head, in place in x, as a model without
        enable_gqa would (the copy made here, untimed). Returns (enable_gqa, note)."""
        from torch.nn.attention import sdpa_kernel
        try:
            with torch.no_grad(), warnings.catch_warnings(), sdpa_kernel(backend):
                warnings.simplefilter("ignore")
                F.scaled_dot_product_attention(x["q"].detach(), x["k"].detach(),
                                               x["v"].detach(), enable_gqa=True)
            return True, ""
        except RuntimeError as e:
            refusal = str(e).strip().splitlines()[0][:120] if str(e).strip() else "refused"
        group = case.H // case.hkv
        expanded = case.B * case.Lk * case.H * (case.D + case.dv) * t_itemsize(case)
        if expanded > self.settings.materialize_limit_bytes:
            raise NotAvailable(f"enable_gqa refused ({refusal}); K/V expanded to every head "
                               f"would take {expanded / 2**30:.1f} GiB")
        for name in ("k", "v"):
            x[name] = x[name].detach().repeat_interleave(group, dim=1).requires_grad_(
                x[name].requires_grad)
        return False, f"K/V expanded to {case.H} heads (enable_gqa refused)"


_FLEX = {}


def _compiled_flex(dynamic):
    """torch.compile(flex_attention), built once per process; the recompile limits are raised so a
    suite's many shapes never silently fall back to the unfused eager path."""
    if dynamic not in _FLEX:
        from torch.nn.attention.flex_attention import flex_attention
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        torch._dynamo.config.accumulated_cache_size_limit = max(
            torch._dynamo.config.accumulated_cache_size_limit, 4096)
        # A float captured by score_mod (softcap) that differs from the previous compile would
        # otherwise become a SymFloat, which flex_attention's captured inputs do not accept.
        if hasattr(torch._dynamo.config, "specialize_float"):
            torch._dynamo.config.specialize_float = True
        # The backward is timed by replaying one graph (retain_graph=True), which a compiled
        # backward with donated buffers refuses ("non-empty donated buffers requires
        # retain_graph=False"): keep the saved buffers instead.
        import torch._functorch.config as functorch_config
        if hasattr(functorch_config, "donated_buffer"):
            functorch_config.donated_buffer = False
        _FLEX[dynamic] = torch.compile(flex_attention, dynamic=dynamic)
    return _FLEX[dynamic]


def _causal_mask_mod(b, h, q_idx, kv_idx):  # module level: one identity, so no recompiles
    return q_idx >= kv_idx


class Flex(Impl):
    """FlexAttention compiled, with a block mask (masks) and a score_mod (softcap, bias, rel-pos)."""
    name = "flex"

    def _block_mask(self, case, t, device):
        from torch.nn.attention.flex_attention import create_block_mask
        if case.kind == "varlen":
            lengths = torch.tensor(case.seqlens, device=device)
            doc = torch.repeat_interleave(torch.arange(len(case.seqlens), device=device), lengths)
            start = t["cu_seqlens"].long()[:-1]
            pos = torch.arange(case.total_tokens, device=device) - start[doc]

            def mask_mod(b, h, q_idx, kv_idx):
                return (doc[q_idx] == doc[kv_idx]) & masks.dense_visible(case, pos[q_idx],
                                                                         pos[kv_idx])
            length = case.total_tokens
        elif not masks.has_mask(case):
            return None
        else:
            length = case.Lq
            if case.kind == "dense" and case.causal and case.window is None:
                mask_mod = _causal_mask_mod
            else:
                def mask_mod(b, h, q_idx, kv_idx):
                    return masks.visible(case, q_idx, kv_idx)
        try:  # _compile avoids materialising [Lq, Lk] index tensors for long sequences
            return create_block_mask(mask_mod, None, None, length, length, device=device,
                                     _compile=device != "cpu")
        except TypeError:
            return create_block_mask(mask_mod, None, None, length, length, device=device)

    @staticmethod
    def _score_mod(case, x):
        """softcap, then bias, then rel-pos (SPEC §2), or None when the case has none of them."""
        if not (case.softcap > 0 or case.bias or case.rel_pos is not None):
            return None
        cap = case.softcap
        bias, rel_h, rel_w = x.get("bias"), x.get("rel_h"), x.get("rel_w")
        wk = case.rel_pos[1] if case.rel_pos is not None else 1
        shared = case.bias_shared

        def score_mod(score, b, h, q_idx, kv_idx):
            if cap > 0:
                score = cap * torch.tanh(score / cap)
            if bias is not None:
                score = score + bias[0 if shared else b, h, q_idx, kv_idx]
            if rel_h is not None:
                score = score + rel_h[b, h, q_idx, kv_idx // wk] + rel_w[b, h, q_idx, kv_idx % wk]
            return score
        return score_mod

    def prepare(self, case, t):
        if self.settings.device == "cpu" and not self.settings.flex_on_cpu:
            raise NotAvailable("compiling FlexAttention per shape is slow on CPU (--flex-cpu)")
        if case.sinks:
            raise NotAvailable("flex_attention has no sink logits")
        try:
            flex = _compiled_flex(self.settings.flex_dynamic)
        except ImportError as e:
            raise NotAvailable(f"FlexAttention unavailable: {e}") from None
        x, leaves, dout, to_common = _prepare_leaves(case, t, _bhld_layout)
        block_mask = self._block_mask(case, t, t["q"].device.type)
        gqa = case.H != case.hkv
        scale = 1.0 / math.sqrt(case.D)
        score_mods = {}  # one score_mod per input dict, built once, so dynamo sees stable closures

        def forward(x):
            if id(x) not in score_mods:
                score_mods[id(x)] = self._score_mod(case, x)
            return flex(x["q"], x["k"], x["v"], score_mod=score_mods[id(x)],
                        block_mask=block_mask, scale=scale, enable_gqa=gqa)
        return Prepared(forward, x, leaves, dout, to_common)


def t_itemsize(case: Case) -> int:
    return TORCH_DTYPES[case.dtype].itemsize


class FmhaKvCache(Impl):
    """fmha.attention_with_kvcache on the case's keys: a contiguous cache [B, L, Hkv, D] (page_size
    0) or the same keys in pages of page_size tokens, shuffled over the pool as a serving engine's
    allocator leaves them, with a block table [B, ceil(L / page_size)] (the last page of each
    sequence partly filled when page_size does not divide L)."""
    is_peer = False

    def __init__(self, settings: Settings, page_size: int = 0):
        super().__init__(settings)
        self.page_size = page_size
        self.name = f"fmha-paged{page_size}" if page_size else "fmha"

    def prepare(self, case, t):
        try:
            import fmha
        except ImportError as e:
            raise NotAvailable(f"import fmha failed: {e}") from None
        if case.kind != "decode":
            raise NotAvailable("a KV cache case (decode suite) only")
        q, k, v = t["q"], t["k"], t["v"]
        device = q.device
        seqlens = torch.full((case.B,), case.Lk, dtype=torch.int32, device=device)
        table = None
        if self.page_size:
            k, v, table = _paged(k, v, self.page_size, seed=case.B * 7919 + case.Lk)
        inputs = {"q": q, "k": k, "v": v}

        def forward(x):
            return fmha.attention_with_kvcache(x["q"], x["k"], x["v"], seqlens,
                                               block_table=table)
        return Prepared(forward, inputs, {}, t["dout"], lambda name, x: x)


def _paged(k, v, page_size: int, seed: int) -> tuple:
    """k, v [B, L, Hkv, *] as pages [B * P, page_size, Hkv, *] in a random order (P = ceil(L /
    page_size), rows past L zero) and the block table [B, P] int32 that finds them."""
    B, L = k.shape[:2]
    per_seq = -(-L // page_size)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(B * per_seq, generator=gen).to(k.device)

    def scatter(x):
        padded = x.new_zeros(B, per_seq * page_size, *x.shape[2:])
        padded[:, :L] = x
        pages = torch.empty_like(padded).view(B * per_seq, page_size, *x.shape[2:])
        pages[order] = padded.view(B * per_seq, page_size, *x.shape[2:])
        return pages
    return scatter(k), scatter(v), order.view(B, per_seq).to(torch.int32)


def decode_impls(settings: Settings, page_sizes=(16, 64, 256)) -> list:
    """The decode suite's implementations: fmha on a contiguous cache and on pages of each size,
    then SDPA's backends (contiguous [B, H, L, D] copies) and the naive peer."""
    return ([FmhaKvCache(settings)] + [FmhaKvCache(settings, p) for p in page_sizes]
            + [Sdpa(settings, b) for b in ("CUDNN_ATTENTION", "FLASH_ATTENTION",
                                            "EFFICIENT_ATTENTION", "MATH")] + [Naive(settings)])


def all_impls(settings: Settings) -> list:
    """fmha first (fmha-fused then fmha-split with backward_impl "both"), then every peer, in the
    order the tables show them."""
    if settings.backward_impl == "both":
        ours = [Fmha(settings, b, f"fmha-{b}") for b in ("fused", "split")]
    else:
        ours = [Fmha(settings, settings.backward_impl)]
    return ours + [Sdpa(settings, b) for b in
                               ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION",
                                "MATH")] + [Flex(settings), Naive(settings)]
