// Which score policy (cuda/common/forward_policies.cuh) an sm90 kernel is instantiated for, where
// the forward and backward kernels give a policy code of its own.
#pragma once

#include <type_traits>

#include "cuda/common/forward_policies.cuh"

namespace fmha::cuda::sm90 {

// The score modifiers together (softcap, bias with other options, dbias): the general policy.
template <typename Policy>
inline constexpr bool kGeneralForm = std::is_same_v<Policy, PolicyGeneral>;
// SAM rel-pos alone (score_rel_pos.cuh): in the forward the register form (rel_w in registers,
// rel_h per half tile); in the backward its rows and table staged, drel written by the dQ kernel.
template <typename Policy>
inline constexpr bool kRelPosForm = std::is_same_v<Policy, PolicyRelPos>;
// An additive bias alone (score_bias.cuh): the register form wherever rows are queries (the
// forward, the dQ kernel: each thread's bias of key tile u fetched one tile ahead); the dK/dV
// kernel reads it transposed from staged tiles.
template <typename Policy>
inline constexpr bool kBiasForm = std::is_same_v<Policy, PolicyBias>;
// Neighborhood attention with the score modifiers (bias and rel-pos by token, softcap).
template <typename Policy>
inline constexpr bool kNeighborhoodModifiersForm = std::is_same_v<Policy, PolicyNeighborhood>;

// Attention over a KV cache (PolicyCache, PolicyCacheSoftcap): key tiles past a sequence's
// length stale, a paged cache's rows through its block table.
template <typename Policy>
inline constexpr bool kCacheForm =
    std::is_same_v<Policy, PolicyCache> || std::is_same_v<Policy, PolicyCacheSoftcap>;

}  // namespace fmha::cuda::sm90
