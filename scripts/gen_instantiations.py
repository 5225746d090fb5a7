#!/usr/bin/env python3
"""Writes the kernel instantiation files: one per (generation, direction, dtype, head-dim bucket),
holding every policy of that combination, under src/cuda/<generation>/generated/.

One small file per variant lets a 16-core build compile them all at once (the build takes as long
as the slowest variant, not the largest file), and lets CMake's FMHA_HEAD_DIM_BUCKETS leave whole
buckets out. Run it after changing the tables below and commit its output:
    python3 scripts/gen_instantiations.py
`--check` writes nothing and fails when the committed files differ from what it would write
(the test command runs it).
"""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUCKETS = [32, 64, 96, 128, 160, 192, 224, 256]
FP16 = ("fp16", "__half")
BF16 = ("bf16", "__nv_bfloat16")
FP32 = ("fp32", "float")

# generation, direction, header, launch functions, params type, dtypes, buckets, policies.
# fp32 runs on the sm80 kernels (tf32 mma.sync), and on the sm90 fp32 kernels where they apply
# (dispatch_fwd.cu: fp32_planes_apply; dispatch_bwd.cu: use_sm90_fp32_backward).
VARIANTS = [
    ("sm80", "fwd", "cuda/sm80/launch_fwd.cuh", ["launch_forward"], "ForwardParams",
     [FP16, BF16, FP32], BUCKETS, ["PolicyPlain", "PolicyGeneral", "PolicyNeighborhood"]),
    ("sm80", "bwd", "cuda/sm80/launch_bwd.cuh", ["launch_backward_dkdv", "launch_backward_dq"],
     "BackwardParams", [FP16, BF16, FP32], BUCKETS, ["PolicyGeneral", "PolicyNeighborhood"]),
    ("sm90", "fwd", "cuda/sm90/launch_fwd.cuh", ["launch_forward"], "ForwardParams",
     [FP16, BF16], BUCKETS, ["PolicyPlain", "PolicyWindow", "PolicyGeneral", "PolicyRelPos"]),
    # The register-form bias in files of their own, so that they compile beside the others.
    ("sm90", "fwd_bias", "cuda/sm90/launch_fwd.cuh", ["launch_forward"], "ForwardParams",
     [FP16, BF16], BUCKETS, ["PolicyBias"]),
    # Softcap alone (the plain schedule with ScoreSoftcap), likewise.
    ("sm90", "fwd_softcap", "cuda/sm90/launch_fwd.cuh", ["launch_forward"], "ForwardParams",
     [FP16, BF16], BUCKETS, ["PolicySoftcap"]),
    # Attention over a KV cache (kv_cache_forward.cu), likewise.
    ("sm90", "fwd_cache", "cuda/sm90/launch_fwd.cuh", ["launch_forward"], "ForwardParams",
     [FP16, BF16], BUCKETS, ["PolicyCache", "PolicyCacheSoftcap"]),
    # Neighborhood attention in files of their own, so that they compile beside the dense ones.
    ("sm90", "fwd_na", "cuda/sm90/launch_fwd.cuh", ["launch_forward"], "ForwardParams",
     [FP16, BF16], BUCKETS, ["PolicyNeighborhoodPlain", "PolicyNeighborhood"]),
    ("sm90", "bwd", "cuda/sm90/launch_bwd.cuh", ["launch_backward_dkdv", "launch_backward_dq"],
     "BackwardParams", [FP16, BF16], BUCKETS, ["PolicyPlain", "PolicyWindow", "PolicyRelPos"]),
    # Neighborhood attention up to D 128 (tile_sizes_bwd.h: kBwdNeighborhoodMaxHeadDim).
    ("sm90", "bwd_na", "cuda/sm90/launch_bwd.cuh", ["launch_backward_dkdv", "launch_backward_dq"],
     "BackwardParams", [FP16, BF16], [b for b in BUCKETS if b <= 128],
     ["PolicyNeighborhoodPlain"]),
    # A bias alone (the dQ kernel's register form, the dK/dV kernel's staged tiles).
    ("sm90", "bwd_bias", "cuda/sm90/launch_bwd.cuh",
     ["launch_backward_dkdv", "launch_backward_dq"], "BackwardParams", [FP16, BF16], BUCKETS,
     ["PolicyBias"]),
    # fp32 on tf32 wgmma from split planes: head dims up to 64 (the 64 bucket serves 32 too).
    ("sm90", "fwd_planes", "cuda/sm90/launch_fwd_fp32.cuh", ["launch_forward_fp32"],
     "ForwardParams", [FP32], [64], ["PolicyPlain", "PolicyWindow"]),
    ("sm90", "bwd_planes", "cuda/sm90/launch_bwd_fp32.cuh", ["launch_backward_fp32"],
     "BackwardParams", [FP32], [64], ["PolicyPlain", "PolicyWindow"]),
    # The warp-specialized fused backward (mainloop_bwd_fused.cuh): buckets 64 and 128.
    ("sm90", "bwd_fused", "cuda/sm90/launch_bwd_fused.cuh", ["launch_backward_fused"],
     "BackwardParams", [FP16, BF16], [64, 128], ["PolicyPlain", "PolicyWindow"]),
    # Softcap alone in the warp-specialized fused backward (PolicySoftcap: ScoreSoftcap's scores),
    # in files of its own, so that the plain and window kernels' files stay as they were.
    ("sm90", "bwd_fused_softcap", "cuda/sm90/launch_bwd_fused.cuh", ["launch_backward_fused"],
     "BackwardParams", [FP16, BF16], [64, 128], ["PolicySoftcap"]),
    # The warp-specialized fused backward of D 256 (mainloop_bwd_fused_d256.cuh), in files of its
    # own: beside the other D 256 backward kernels it changed their generated code.
    ("sm90", "bwd_fused256", "cuda/sm90/launch_bwd_fused_d256.cuh", ["launch_backward_fused_d256"],
     "BackwardParams", [FP16, BF16], [256], ["PolicyPlain", "PolicyWindow"]),
    # Softcap alone in the D 256 one (PolicySoftcap), likewise in files of its own.
    ("sm90", "bwd_fused256_softcap", "cuda/sm90/launch_bwd_fused_d256.cuh",
     ["launch_backward_fused_d256"], "BackwardParams", [FP16, BF16], [256], ["PolicySoftcap"]),
    # Score modifiers (softcap, bias) in files of their own, likewise.
    ("sm90", "bwd_general", "cuda/sm90/launch_bwd.cuh",
     ["launch_backward_dkdv", "launch_backward_dq"], "BackwardParams", [FP16, BF16], BUCKETS,
     ["PolicyGeneral"]),
]

DIRECTION_NAMES = {"fwd": "forward", "fwd_planes": "forward on fp32 planes (tf32 wgmma)",
                   "bwd_planes": "backward on fp32 planes (tf32 wgmma)",
                   "fwd_bias": "forward with a bias alone", "fwd_softcap": "forward with softcap alone",
                   "fwd_cache": "forward over a KV cache", "fwd_na": "neighborhood forward",
                   "bwd": "backward", "bwd_fused": "fused backward (warp-specialized)",
                   "bwd_fused256": "fused backward of D 256 (warp-specialized)",
                   "bwd_fused256_softcap": "fused backward of D 256 with softcap alone (warp-specialized)",
                   "bwd_fused_softcap": "fused backward with softcap alone (warp-specialized)",
                   "bwd_na": "neighborhood backward",
                   "bwd_bias": "backward with a bias alone", "bwd_general": "backward with score modifiers"}


def render(gen, direction, header, functions, params, bucket, dtype_name, ctype, policies):
    lines = [
        "// Generated by scripts/gen_instantiations.py; do not edit by hand.",
        "// clang-format off",
        f"// {gen} {DIRECTION_NAMES[direction]}, {dtype_name}, head-dim bucket {bucket}: "
        f"{', '.join(p.removeprefix('Policy').lower() for p in policies)}.",
        f'#include "{header}"',
        "",
        f"namespace fmha::cuda::{gen} {{",
    ]
    for policy in policies:
        for function in functions:
            lines.append(f"template Status {function}<{ctype}, {bucket}, {policy}>(")
            lines.append(f"    const {params}&, cudaStream_t);")
    lines.append(f"}}  // namespace fmha::cuda::{gen}")
    return "\n".join(lines) + "\n"


def expected_files():
    """{path: text} of every generated file."""
    files = {}
    for gen, direction, header, functions, params, dtypes, buckets, policies in VARIANTS:
        folder = ROOT / "src" / "cuda" / gen / "generated"
        for dtype_name, ctype in dtypes:
            for bucket in buckets:
                path = folder / f"{direction}_{dtype_name}_d{bucket:03d}.cu"
                files[path] = render(gen, direction, header, functions, params, bucket,
                                     dtype_name, ctype, policies)
    return files


def main():
    files = expected_files()
    folders = {path.parent for path in files}
    present = {path for folder in folders for path in folder.glob("*.cu")}
    if "--check" in sys.argv[1:]:
        stale = sorted(str(p.relative_to(ROOT)) for p in present - files.keys())
        differ = sorted(str(p.relative_to(ROOT)) for p, text in files.items()
                        if not p.exists() or p.read_text() != text)
        if stale or differ:
            sys.exit(f"gen_instantiations: out of date (run the script): {differ + stale}")
        return
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text)
    for path in present - files.keys():
        path.unlink()


if __name__ == "__main__":
    main()
