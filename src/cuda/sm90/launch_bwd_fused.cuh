// Definition of the warp-specialized fused sm90 backward's launch; included only by the
// instantiation files.
#pragma once

#include <string>

#include "cuda/common/block_coords.cuh"
#include "cuda/common/kernel_attributes.h"
#include "cuda/sm90/dq_accumulator.cuh"
#include "cuda/sm90/launch_bwd_fused.h"
#include "cuda/sm90/mainloop_bwd_fused.cuh"

namespace fmha::cuda::sm90 {

template <typename T, int kD, typename Policy>
Status launch_backward_fused(const BackwardParams& params, cudaStream_t stream) {
  using Smem = FusedBackwardSmem<kD>;
  BackwardParams p = params;
  ForwardParams& f = p.fwd;
  const std::int64_t kv_heads = f.heads / f.kv_group;
  const std::int64_t key_tiles = (f.seqlen_k + Smem::kN - 1) / Smem::kN;
  // Head sections under causal masks (block_coords.cuh): each block streams Q and dO of its
  // query heads.
  f.head_section_log2 = head_section_log2_for(
      f, key_tiles, kv_heads, f.kv_group * f.seqlen_q * (f.head_dim + f.value_dim) * 2);
  const dim3 grid = batch_grid(f, key_tiles, kv_heads);
  FusedBackwardMaps maps;
  const bool mapped = encode_fused_maps<typename Smem::KTile, typename Smem::QTile>(
      &maps, p, Smem::kN, Smem::kM);
  // The kernel copies whole query tiles of the row statistics (stat_rows), 16 bytes aligned.
  const bool stats_padded = f.cu_seqlens_q == nullptr &&
                            p.stat_rows >= (f.seqlen_q + Smem::kM - 1) / Smem::kM * Smem::kM &&
                            p.stat_head_stride >= p.stat_rows && p.stat_head_stride % 4 == 0 &&
                            p.stat_batch_stride % 4 == 0 &&
                            reinterpret_cast<std::uintptr_t>(p.lse_log2) % 16 == 0 &&
                            reinterpret_cast<std::uintptr_t>(p.delta) % 16 == 0;
  if (!mapped || !stats_padded) {
    return Status::backend_error(
        "fmha: internal error: the fused sm90 backward was chosen for tensors without tensor maps "
        "or statistics not padded to whole query tiles");
  }
  if (grid.x > 0 && grid.y > 0 && grid.z > 0) {
    constexpr auto* kernel = &backward_fused_kernel<T, kD, Policy>;
    cudaError_t e = allow_dynamic_smem<kernel>(Smem::kLaunchBytes);
    if (e != cudaSuccess) {
      return Status::backend_error(
          std::string("fmha: CUDA fused backward kernel (sm90) could not get ") +
          std::to_string(Smem::kLaunchBytes) + " bytes of shared memory: " + cudaGetErrorString(e));
    }
    kernel<<<grid, kBwdFusedThreads, Smem::kLaunchBytes, stream>>>(p, maps);
    e = cudaGetLastError();
    if (e != cudaSuccess) {
      return Status::backend_error(
          std::string("fmha: CUDA fused backward kernel (sm90) launch failed: ") +
          cudaGetErrorString(e));
    }
  }
  const std::int64_t query_tiles = (f.seqlen_q + Smem::kM - 1) / Smem::kM;
  if (query_tiles == 0) return Status::ok_status();
  auto dq_aligned = [&](int elements) {
    return f.head_dim % elements == 0 && p.dq_row_stride % elements == 0 &&
           p.dq_head_stride % elements == 0 && p.dq_batch_stride % elements == 0 &&
           reinterpret_cast<std::uintptr_t>(p.dq) % (2 * elements) == 0;
  };
  const DqStores stores = dq_aligned(8)   ? DqStores::kVectors
                          : dq_aligned(2) ? DqStores::kPairs
                                          : DqStores::kElements;
  const dim3 convert_grid(static_cast<unsigned>(query_tiles), static_cast<unsigned>(f.heads),
                          static_cast<unsigned>(f.batch));
  convert_dq_accumulator_kernel<T, kD><<<convert_grid, 256, 0, stream>>>(p, stores);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    return Status::backend_error(
        std::string("fmha: CUDA dQ conversion kernel (sm90) launch failed: ") +
        cudaGetErrorString(e));
  }
  return Status::ok_status();
}

}  // namespace fmha::cuda::sm90
