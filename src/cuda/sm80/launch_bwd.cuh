// Definitions of the sm80 backward launches; included only by the instantiation files.
#pragma once

#include <string>

#include "cuda/sm80/launch_bwd.h"
#include "cuda/sm80/launch_smem.cuh"
#include "cuda/sm80/mainloop_bwd_dkdv.cuh"
#include "cuda/sm80/mainloop_bwd_dq.cuh"

namespace fmha::cuda::sm80 {

namespace detail_bwd {

template <auto kKernel>
Status launch_checked(const char* name, dim3 grid, int smem_bytes, const BackwardParams& p,
                      cudaStream_t stream) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return Status::ok_status();
  FMHA_RETURN_IF_ERROR(request_shared_memory<kKernel>(name, smem_bytes));
  kKernel<<<grid, kThreads, smem_bytes, stream>>>(p);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    return Status::backend_error(std::string("fmha: CUDA ") + name +
                                 " kernel (sm80) launch failed: " + cudaGetErrorString(e));
  }
  return Status::ok_status();
}

}  // namespace detail_bwd

template <typename T, int kD, typename Policy>
Status launch_backward_dkdv(const BackwardParams& p, cudaStream_t stream) {
  constexpr bool kTokenTiles = Policy::Mask::kTokenTiles;
  // Token tiles: one block per key box, their bookkeeping after the per-row statistics.
  constexpr int kSmem =
      bwd_dkdv_smem_bytes<T>(kD) +
      (kTokenTiles ? static_cast<int>(sizeof(DkDvTokenTileSmem<bwd_block_m<T>(kD), kBwdBlockN>))
                   : 0);
  // 16-bit variants fit the 99 KB of sm86/sm89; fp32 above bucket 128 opts in to more
  // (tile_sizes_bwd.h).
  static_assert(kSmem <= (sizeof(T) == 4 && kD > 128 ? kMaxSmemBytes : kPortableSmemBytes),
                "shared memory per block");
  std::int64_t key_blocks = (p.fwd.seqlen_k + kBwdBlockN - 1) / kBwdBlockN;
  if constexpr (kTokenTiles)
    key_blocks = neighborhood::num_block_boxes(p.fwd.neighborhood, kBwdBlockN);
  const std::int64_t tiles = key_blocks + (p.fwd.num_extra + kBwdBlockN - 1) / kBwdBlockN;
  const dim3 grid(static_cast<unsigned>(tiles * p.num_chunks),
                  static_cast<unsigned>(p.fwd.heads / p.fwd.kv_group),
                  static_cast<unsigned>(p.fwd.batch));
  return detail_bwd::launch_checked<&backward_dkdv_kernel<T, kD, Policy>>("backward dK/dV", grid,
                                                                          kSmem, p, stream);
}

template <typename T, int kD, typename Policy>
Status launch_backward_dq(const BackwardParams& p, cudaStream_t stream) {
  using Mask = typename Policy::Mask;
  // Token tiles: one block per query box, their bookkeeping after the K/V tiles.
  std::int64_t blocks = (p.fwd.seqlen_q + kBlockM - 1) / kBlockM;
  if constexpr (dq_token_tiles<T, kD, Mask>())
    blocks = neighborhood::num_block_boxes(p.fwd.neighborhood, kBlockM);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.fwd.heads),
                  static_cast<unsigned>(p.fwd.batch));
  return detail_bwd::launch_checked<&backward_dq_kernel<T, kD, Policy>>(
      "backward dQ", grid, dq_smem_bytes<T, kD, Mask>(), p, stream);
}

}  // namespace fmha::cuda::sm80
