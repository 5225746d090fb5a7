// Definition of the D 256 warp-specialized fused backward's launch (launch_bwd_fused_d256.h);
// included only by the instantiation files.
#pragma once

#include <string>

#include "cuda/common/block_coords.cuh"
#include "cuda/common/kernel_attributes.h"
#include "cuda/sm90/launch_bwd_fused_d256.h"
#include "cuda/sm90/mainloop_bwd_fused_d256.cuh"
#include "cuda/sm90/tile_sizes_bwd.h"

namespace fmha::cuda::sm90 {

template <typename T, int kD, typename Policy>
Status launch_backward_fused_d256(const BackwardParams& params, cudaStream_t stream) {
  static_assert(kD == 256, "head-dim bucket 256");
  using Smem = FusedD256Smem;
  BackwardParams p = params;
  ForwardParams& f = p.fwd;
  FusedBackwardMaps maps;
  // Rows on both sides (an empty side's zero gradients are the other kernels' job) of a dense
  // batch that tensor maps describe.
  if (f.seqlen_q <= 0 || f.seqlen_k <= 0 || f.cu_seqlens_q != nullptr ||
      !encode_fused_maps<Smem::KTile, Smem::QTile>(&maps, p, Smem::kN, Smem::kM)) {
    return Status::not_supported(
        "fmha: the warp-specialized fused backward of D 256 takes dense batches with queries and "
        "keys that tensor maps describe");
  }
  if (!ws_backward_takes_scale(f)) {
    return Status::not_supported(
        "fmha: the warp-specialized fused backward of D 256 takes positive scales");
  }
  const std::int64_t kv_heads = f.heads / f.kv_group;
  const std::int64_t key_tiles = (f.seqlen_k + Smem::kN - 1) / Smem::kN;
  f.head_section_log2 = head_section_log2_for(
      f, key_tiles, kv_heads, f.kv_group * f.seqlen_q * (f.head_dim + f.value_dim) * 2);
  const dim3 grid = batch_grid(f, key_tiles, kv_heads);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return Status::ok_status();
  // Without a dQ accumulator (the split form) the kernel computes dK and dV only.
  auto launch = [&](auto kernel) {
    cudaError_t e = allow_dynamic_smem<decltype(kernel)::value>(Smem::kLaunchBytes);
    if (e == cudaSuccess) {
      decltype(kernel)::value<<<grid, kBwdFusedThreads, Smem::kLaunchBytes, stream>>>(p, maps);
      e = cudaGetLastError();
    }
    return e;
  };
  const cudaError_t e =
      p.dq_accum != nullptr ? launch(KernelConstant<&backward_fused_d256_kernel<T, Policy, true>>{})
                            : launch(KernelConstant<&backward_fused_d256_kernel<T, Policy, false>>{});
  if (e != cudaSuccess) {
    return Status::backend_error(std::string("fmha: CUDA fused backward kernel of D 256 (sm90): ") +
                                 cudaGetErrorString(e));
  }
  return Status::ok_status();
}

}  // namespace fmha::cuda::sm90
