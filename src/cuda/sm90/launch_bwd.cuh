// Definitions of the sm90 backward launches; included only by the instantiation files.
#pragma once

#include <string>
#include <type_traits>

#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/env_switch.h"
#include "cuda/common/kernel_attributes.h"
#include "cuda/sm90/launch_bwd.h"
#include "cuda/sm90/launch_bwd_fused_d256.h"
#include "cuda/sm90/launch_limits.h"
#include "cuda/sm90/mainloop_bwd_dkdv.cuh"
#include "cuda/sm90/mainloop_bwd_dq.cuh"

namespace fmha::cuda::sm90 {
namespace detail {

// kKernel: the kernel, a template argument so that its shared-memory opt-in is remembered per
// kernel (allow_dynamic_smem); a caller that picks among variants at run time launches each
// through its own instantiation (launch_backward_dq). `args`: the kernel's parameters (the
// BackwardParams, and the tensor maps). overlap_previous: the kernel may start while the one
// before it in the stream still runs (programmatic dependent launch; grid_dependency.cuh says
// what each side does).
template <auto kKernel, typename... Params>
Status launch_bwd_kernel(dim3 grid, int smem, cudaStream_t stream, const char* name,
                         bool overlap_previous, const Params&... args) {
  static_assert(std::is_same_v<decltype(kKernel), void (*)(Params...)>,
                "the arguments are the kernel's parameters");
  if (grid.x == 0) return Status::ok_status();  // no keys (dK/dV are empty) or no queries
  cudaError_t e = allow_dynamic_smem<kKernel>(smem);
  if (e != cudaSuccess) {
    return Status::backend_error(std::string("fmha: CUDA backward ") + name +
                                 " kernel (sm90) could not get " + std::to_string(smem) +
                                 " bytes of shared memory: " + cudaGetErrorString(e));
  }
  e = launch_maybe_overlapped(kKernel, grid, dim3(kBwdThreads), smem, stream, overlap_previous,
                              args...);
  if (e != cudaSuccess) {
    return Status::backend_error(std::string("fmha: CUDA backward ") + name +
                                 " kernel (sm90) launch failed: " + cudaGetErrorString(e));
  }
  return Status::ok_status();
}

// Bias tiles (one a stage; the general policy's, and the bias policy's in the dQ kernel) are
// staged when their rows are whole 16-byte chunks and they fit next to the kernel's other shared
// memory `smem`; sets p.fwd.bias_staged.
inline int stage_bias(BackwardParams& p, int smem, int tile_bytes, int stages = kBwdStages) {
  const int bytes = stages * tile_bytes;
  p.fwd.bias_staged = bias_stageable(p.fwd) && smem + bytes <= max_block_smem();
  return p.fwd.bias_staged ? bytes : 0;
}

// The dK/dV kernels of one call: the split form's (one kernel up to D 128; at D 256 the
// warp-specialized kernel without its dQ part for the plain and window policies where tensor maps
// apply, else the dK and dV parts' kernels), or the fused form's (p.dq_accum set): one kernel up to
// D 128, and at D 256 the warp-specialized kernel (plain and window policies, where tensor maps
// apply), else the fused dK part's kernel followed by the split form's dV part (dv_only: that part
// alone).
template <typename T, int kD, typename Policy>
Status launch_dkdv(const BackwardParams& params, cudaStream_t stream, bool dv_only) {
  BackwardParams p = params;
  constexpr bool kTokenTiles = Policy::Mask::kTokenTiles;
  static_assert(!kTokenTiles || kD <= kBwdNeighborhoodMaxHeadDim, "as the dispatch refuses");
  p.fwd.batch_innermost =
      (kGeneralForm<Policy> || kBiasForm<Policy>) && bias_shared_by_batches(p.fwd);
  // Token tiles: one block a key box of the grid (neighborhood_mask.cuh).
  const std::int64_t key_tiles =
      kTokenTiles ? neighborhood::num_block_boxes(p.fwd.neighborhood, kBwdKeysPerBlock)
                  : (p.fwd.seqlen_k + kBwdKeysPerBlock - 1) / kBwdKeysPerBlock;
  if constexpr (kTokenTiles) {  // the kernel's key box and query boxes (init_key_box)
    set_token_tiles<DkDvTokenTiles<kD>>(p.fwd.neighborhood);
  } else {  // head sections (block_coords.cuh): each block streams Q and dO of its query heads
    p.fwd.head_section_log2 = head_section_log2_for(
        p.fwd, key_tiles, p.fwd.heads / p.fwd.kv_group,
        p.fwd.kv_group * p.fwd.seqlen_q * (p.fwd.head_dim + p.fwd.value_dim) * 2);
  }
  const dim3 grid = batch_grid(p.fwd, key_tiles, p.fwd.heads / p.fwd.kv_group);
  int smem = bwd_dkdv_smem_bytes<kD, kTokenTiles>();
  int stages = kBwdStages;
  // The fused backward (dq_accum set; sm90_fused_backward_applies): its stages' tiles, the dQ sum
  // tile after them (up to D 128), the tail after the statistics aligned to 1024 bytes, and the
  // dS^T tile there unless the bias is staged (then it takes the bias tile of its stage:
  // mainloop_bwd_dkdv.cuh).
  constexpr bool kFusable = sm90_fused_backward_instantiated<kD, Policy>();
  using Fused = FusedDq<kFusable ? kD : 64, kBwdKeysPerBlock, bwd_queries_per_tile(kD)>;
  const bool fused = p.dq_accum != nullptr && !dv_only;
  if (fused) {
    if constexpr (kFusable) {
      stages = bwd_dkdv_stages(kD, true);
      smem = bwd_dkdv_smem_bytes<kD, false, bwd_dkdv_stages(kD, true)>() + Fused::kSumBytes + 1024;
    } else {
      return Status::backend_error(
          "fmha: internal error: the sm90 fused backward has no kernel for this problem");
    }
  }
  if constexpr (kTokenTiles) smem += static_cast<int>(sizeof(DkDvTokenTiles<kD>));
  if constexpr (std::is_same_v<Policy, PolicyRelPos>) {
    smem += static_cast<int>(bwd_rel_w_rows_bytes(p.fwd, kD));
  }
  // The bias policy's tiles start at a 1024-byte boundary (the fused kernel's tail already does).
  if constexpr (kBiasForm<Policy>) {
    if (!fused) smem += 1024;
  }
  if constexpr (kGeneralForm<Policy> || kBiasForm<Policy>) {
    smem += detail::stage_bias(p, smem, bwd_dkdv_bias_tile_bytes(kD), stages);
  }
  BackwardTileMaps maps;
  if constexpr (kBiasForm<Policy>) {  // reads staged tiles only: else the general policy
    if (!p.fwd.bias_staged) return launch_dkdv<T, kD, PolicyGeneral>(params, stream, dv_only);
    // By TMA in a dense batch whose bias the driver maps.
    maps.bias_usable =
        tma_enabled() && p.fwd.cu_seqlens_q == nullptr &&
        encode_bias_map<DkDvBiasTile<kD>>(&maps.bias, p.fwd, bwd_queries_per_tile(kD));
  }
  if constexpr (kFusable) {
    if (fused) {
      if (!ds_in_bias_tile<Policy>(p.fwd.bias_staged)) smem += Fused::DsTile::kBytes;
      if constexpr (bwd_num_parts(kD) == 1) {
        return detail::launch_bwd_kernel<&backward_dkdv_kernel<T, kD, Policy, DkDvPart::kBoth, true>>(
            grid, smem, stream, "fused dK/dV/dQ", false, p, maps);
      } else {
        if constexpr (kD == 256 && (std::is_same_v<Policy, PolicyPlain> ||
                                    std::is_same_v<Policy, PolicyWindow>)) {
          // The warp-specialized kernel; where it does not apply (varlen, rows that tensor maps
          // cannot describe) the form below.
          const Status status = launch_backward_fused_d256<T, kD, Policy>(params, stream);
          if (status.code() != StatusCode::kNotSupported) return status;
        }
        const Status s =
            detail::launch_bwd_kernel<&backward_dkdv_kernel<T, kD, Policy, DkDvPart::kDk, true>>(
                grid, smem, stream, "fused dK/dQ", false, p, maps);
        if (!s.ok()) return s;
        return launch_dkdv<T, kD, Policy>(params, stream, /*dv_only=*/true);
      }
    }
  }
  if constexpr (bwd_num_parts(kD) == 1) {
    return detail::launch_bwd_kernel<&backward_dkdv_kernel<T, kD, Policy, DkDvPart::kBoth>>(
        grid, smem, stream, "dK/dV", false, p, maps);
  } else {
    if constexpr (kD == 256 && (std::is_same_v<Policy, PolicyPlain> ||
                                std::is_same_v<Policy, PolicyWindow>)) {
      // The split form's dK and dV from one warp-specialized kernel without its dQ part (S and
      // dP once instead of in both part kernels); where it does not apply, the two kernels below.
      if (!dv_only) {
        const Status status = launch_backward_fused_d256<T, kD, Policy>(params, stream);
        if (status.code() != StatusCode::kNotSupported) return status;
      }
    }
    if (!dv_only) {
      const Status s = detail::launch_bwd_kernel<&backward_dkdv_kernel<T, kD, Policy, DkDvPart::kDk>>(
          grid, smem, stream, "dK", false, p, maps);
      if (!s.ok()) return s;
    }
    return detail::launch_bwd_kernel<&backward_dkdv_kernel<T, kD, Policy, DkDvPart::kDv>>(
        grid, smem, stream, "dV", false, p, maps);
  }
}

}  // namespace detail

template <typename T, int kD, typename Policy>
Status launch_backward_dkdv(const BackwardParams& params, cudaStream_t stream) {
  return detail::launch_dkdv<T, kD, Policy>(params, stream, /*dv_only=*/false);
}

template <typename T, int kD, typename Policy>
Status launch_backward_dq(const BackwardParams& params, cudaStream_t stream) {
  BackwardParams p = params;
  constexpr bool kTokenTiles = Policy::Mask::kTokenTiles;
  static_assert(!kTokenTiles || kD <= kBwdNeighborhoodMaxHeadDim, "as the dispatch refuses");
  p.fwd.batch_innermost =
      (kGeneralForm<Policy> || kBiasForm<Policy>) && bias_shared_by_batches(p.fwd);
  // Token tiles: one block a query box of the grid (neighborhood_mask.cuh).
  const std::int64_t query_tiles =
      kTokenTiles ? neighborhood::num_block_boxes(p.fwd.neighborhood, kBwdQueriesPerBlock)
                  : (p.fwd.seqlen_q + kBwdQueriesPerBlock - 1) / kBwdQueriesPerBlock;
  if constexpr (kTokenTiles) {  // the kernel's query box and key boxes (init_query_box)
    set_token_tiles<DqTokenTiles<kD, Policy>>(p.fwd.neighborhood);
  } else {  // head sections (block_coords.cuh): each block streams its head's K and V
    p.fwd.head_section_log2 = head_section_log2_for(
        p.fwd, query_tiles, p.fwd.heads, p.fwd.seqlen_k * (p.fwd.head_dim + p.fwd.value_dim) * 2);
  }
  const dim3 grid = batch_grid(p.fwd, query_tiles, p.fwd.heads);
  int smem = bwd_dq_smem_bytes<kD, Policy>();
  if constexpr (kTokenTiles) {
    smem += static_cast<int>(sizeof(DqTokenTiles<kD, Policy>));
  }
  if constexpr (kRelPosForm<Policy>) smem += static_cast<int>(bwd_rel_pos_smem_bytes(p.fwd));
  // The bias policy stages its tiles up to D 64 (3 x 128 queries x 128 keys: 225 of the 227 KB),
  // where it was measured (SAM-B, H200, 2026-11-26), in a kernel of their own (kBiasTiles); above,
  // and where stage_bias declines, the register form.
  constexpr bool kBiasTiles = kBiasForm<Policy> && kD <= 64;
  if constexpr (kGeneralForm<Policy> || kBiasTiles) {
    smem += detail::stage_bias(p, smem, bwd_dq_bias_tile_bytes(kD, kDqScores<Policy>));
  }
  // The bias tiles' kernel takes its key tiles by TMA in a dense batch whose k and v (and bias)
  // the driver maps.
  BackwardTileMaps maps;
  if constexpr (kBiasTiles) {
    if (p.fwd.bias_staged && tma_enabled() && p.fwd.cu_seqlens_q == nullptr) {
      constexpr int kN = bwd_keys_per_tile(kD);
      maps.kv_usable = encode_kv_maps<SwizzledTile<kN, kD>>(&maps.k, &maps.v, p.fwd, kN);
      maps.bias_usable =
          maps.kv_usable && encode_bias_map<DqBiasTile<kD>>(&maps.bias, p.fwd, kBwdQueriesPerBlock);
    }
  }
  // `kernel`: a KernelConstant naming the variant chosen below.
  auto launch = [&](auto kernel) {
    return detail::launch_bwd_kernel<decltype(kernel)::value>(grid, smem, stream, "dQ",
                                                              p.dq_overlaps_dkdv, p, maps);
  };
  if constexpr (kBiasTiles) {
    if (p.fwd.bias_staged) {
      return launch(KernelConstant<&backward_dq_kernel<T, kD, Policy, 0, true>>{});
    }
  }
  if constexpr (kRelPosForm<Policy>) {
    // The register form where a key tile is one or two grid rows; its rel_h fetch takes key
    // positions as 32-bit, one tile past the last (fetch_rel_h).
    constexpr int kN = bwd_keys_per_tile(kD, kDqScores<Policy>);
    if (p.fwd.seqlen_k <= (std::int64_t{1} << 31) - 2 * kN) {
      if (rel_pos_registers_apply<2>(p.fwd.rel_w_size, kN)) {
        return launch(KernelConstant<&backward_dq_kernel<T, kD, Policy, 2>>{});
      } else if constexpr (kN <= 64) {  // with 128-key tiles its rel_w spills (48 bytes, D 64)
        if (rel_pos_registers_apply<1>(p.fwd.rel_w_size, kN)) {
          return launch(KernelConstant<&backward_dq_kernel<T, kD, Policy, 1>>{});
        }
      }
    }
  }
  return launch(KernelConstant<&backward_dq_kernel<T, kD, Policy>>{});
}

}  // namespace fmha::cuda::sm90
