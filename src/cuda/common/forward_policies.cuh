// Forward policies: the compile-time axis of the forward kernels besides dtype and head-dim
// bucket. A policy bundles the mask and the score modifiers an instantiation supports.
#pragma once

#include "cuda/common/mask_policies.cuh"
#include "cuda/common/neighborhood_mask.cuh"
#include "cuda/common/score_bias.cuh"
#include "cuda/common/score_modifiers.cuh"
#include "cuda/common/score_rel_pos.cuh"

namespace fmha::cuda {

// Plain attention (no mask but ragged tails, scale only) gets its own lean instantiation; every
// other feature runs through the general one, enabled by runtime values.
struct PolicyPlain {
  using Mask = MaskNone;
  template <typename T>
  using Scores = ScoreScale;
};

// Plain attention over long rows: the plain policy in the sm90 forward's wider key tiles at D 256
// (sm90/forward_pipeline.cuh: fwd_block_n), which its launch picks from the key count.
struct PolicyPlainLongRows {
  using Mask = MaskNone;
  template <typename T>
  using Scores = ScoreScale;
};

// Causal and windows without score modifiers: the general policy's mask with the plain policy's
// scores, so the most common masked case does not pay the modifiers' registers.
struct PolicyWindow {
  using Mask = MaskWindow;
  template <typename T>
  using Scores = ScoreScale;
};

// Causal and windows over long rows: the window policy on the sm90 forward's three math warpgroups
// up to D 64 (sm90/forward_pipeline.cuh: fwd_warp_groups), which its launch picks from the query
// count.
struct PolicyWindowLongRows {
  using Mask = MaskWindow;
  template <typename T>
  using Scores = ScoreScale;
};

struct PolicyGeneral {
  using Mask = MaskWindow;
  template <typename T>
  using Scores = ScoreModifiers<T>;
};

// SAM-style rel-pos alone on a power-of-two key grid width (score_rel_pos.cuh): the general
// policy's result at about the plain policy's cost. The sm90 kernels only: the forward's register
// form (two grid rows a key tile), the backward's staged form; their launches fall back to the
// general policy where the layout does not apply.
struct PolicyRelPos {
  using Mask = MaskNone;
  template <typename T>
  using Scores = ScoreRelPos<T>;
};

// An additive bias alone, masks allowed (score_bias.cuh): the sm90 forward's register form, which
// keeps the ping-pong schedule; its launch falls back to the general policy where the bias's
// layout does not allow the pair loads.
struct PolicyBias {
  using Mask = MaskWindow;
  template <typename T>
  using Scores = ScoreBias<T>;
};

// Softcap with nothing else but a mask (score_modifiers.cuh: ScoreSoftcap): the sm90 forward keeps
// the plain policies' schedule (ping-pong, the softmax overlapped with P V, the copy warpgroup),
// which the general policy gives up for its staged bias tiles; the warp-specialized fused backward
// (sm90/mainloop_bwd_fused.cuh) runs it at D 64 / 128 instead of the split kernels' general policy.
struct PolicySoftcap {
  using Mask = MaskWindow;
  template <typename T>
  using Scores = ScoreSoftcap<T>;
};

// Attention over a KV cache (ForwardParams::seqused_k: the KV-cache API's prefill on the sm90
// forward, kv_cache_forward.cu): the window or the softcap policy (their masks and scores) over keys
// read from a cache, contiguous or paged (sm90/policy_forms.h: kCacheForm), whose rows past a
// sequence's length are stale and whose pages come through the block table. Types of their own, so
// that the dense kernels carry none of it: in the copy warpgroup's 40 registers the page lookups
// beside the dense copies cost the dense forward 3-7% (H200, 2026-11-29, kernels alone, D 64 / 128
// at L 512 / 2048).
struct PolicyCache : PolicyWindow {};
struct PolicyCacheSoftcap : PolicySoftcap {};

// Neighborhood attention: its own mask, every score modifier (softcap, bias and rel-pos over the
// flattened grid); sinks and extra keys run as in every policy.
struct PolicyNeighborhood {
  using Mask = MaskNeighborhood;
  template <typename T>
  using Scores = ScoreModifiers<T>;
};

// Neighborhood attention without score modifiers: the plain policy's scores, so that the most
// common case does not pay the modifiers' registers (the sm90 kernels; sinks and extra keys too).
struct PolicyNeighborhoodPlain {
  using Mask = MaskNeighborhood;
  template <typename T>
  using Scores = ScoreScale;
};

// The factor the backward kernels' exponentials apply to a tile's scores after the policy's own
// transform: the plain scale where it is folded into them (scale_foldable: not applied before),
// log2(e) for the register-form bias's natural-unit scores, else 1 (the scores are in log2 units
// already). The forward spells out the same choice in place: moving it here changed its general
// policy's instruction schedule.
template <typename Scores>
__device__ __forceinline__ float exponent_scale(const Scores& scores) {
  return scale_foldable(scores) ? scores.scale_log2 : 1.0f;
}
template <typename T>
__device__ __forceinline__ float exponent_scale(const ScoreBias<T>&) {
  return ScoreBias<T>::kExpScale;
}

// Bias and rel-pos of element (i, j) in log2 units, one element at a time, for tiles that are not
// row-major ranges of the sequence: the backward dK/dV kernel's (rows are keys) and the
// neighborhood forward's (rows and keys gathered from a grid box).
__device__ __forceinline__ bool has_additive(const ScoreScale&) {
  return false;
}
__device__ __forceinline__ float additive_log2(const ScoreScale&, std::int64_t, std::int64_t) {
  return 0.0f;
}
template <typename T>
__device__ __forceinline__ bool has_additive(const ScoreModifiers<T>& s) {
  return s.bias != nullptr || s.rel_h != nullptr;
}
template <typename T>
__device__ __forceinline__ float additive_log2(const ScoreModifiers<T>& s, std::int64_t i,
                                               std::int64_t j) {
  return s.additive_log2(i, j);
}

}  // namespace fmha::cuda
