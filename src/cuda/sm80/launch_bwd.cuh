// Definitions of the sm80 backward launches; included only by the instantiation files.
#pragma once

#include <string>

#include "cuda/sm80/launch_bwd.h"
#include "cuda/sm80/mainloop_bwd_dkdv.cuh"
#include "cuda/sm80/mainloop_bwd_dq.cuh"

namespace fmha::cuda::sm80 {

namespace detail_bwd {

template <typename Kernel>
Status launch_checked(Kernel* kernel, const char* name, dim3 grid, int smem_bytes,
                      const BackwardParams& p, cudaStream_t stream) {
  constexpr int kDefaultSmemLimit = 48 * 1024;  // beyond it a kernel must opt in
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return Status::ok_status();
  if (smem_bytes > kDefaultSmemLimit) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (e != cudaSuccess) {
      return Status::backend_error(std::string("fmha: CUDA ") + name +
                                   " kernel (sm80) could not get " + std::to_string(smem_bytes) +
                                   " bytes of shared memory: " + cudaGetErrorString(e));
    }
  }
  kernel<<<grid, kThreads, smem_bytes, stream>>>(p);
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
      bwd_dkdv_smem_bytes(kD) +
      (kTokenTiles ? static_cast<int>(sizeof(DkDvTokenTileSmem<bwd_block_m(kD), kBwdBlockN>)) : 0);
  static_assert(kSmem <= 99 * 1024, "sm86/sm89 allow 99 KB per block");
  std::int64_t key_blocks = (p.fwd.seqlen_k + kBwdBlockN - 1) / kBwdBlockN;
  if constexpr (kTokenTiles)
    key_blocks = neighborhood::num_block_boxes(p.fwd.neighborhood, kBwdBlockN);
  const std::int64_t tiles = key_blocks + (p.fwd.num_extra + kBwdBlockN - 1) / kBwdBlockN;
  const dim3 grid(static_cast<unsigned>(tiles * p.num_chunks),
                  static_cast<unsigned>(p.fwd.heads / p.fwd.kv_group),
                  static_cast<unsigned>(p.fwd.batch));
  return detail_bwd::launch_checked(&backward_dkdv_kernel<T, kD, Policy>, "backward dK/dV", grid,
                                    kSmem, p, stream);
}

template <typename T, int kD, typename Policy>
Status launch_backward_dq(const BackwardParams& p, cudaStream_t stream) {
  using Mask = typename Policy::Mask;
  // Token tiles: one block per query box, their bookkeeping after the K/V tiles.
  constexpr int kSmem = dq_smem_bytes<kD, Mask>();
  static_assert(kSmem <= 99 * 1024, "sm86/sm89 allow 99 KB per block");
  std::int64_t blocks = (p.fwd.seqlen_q + kBlockM - 1) / kBlockM;
  if constexpr (dq_token_tiles<kD, Mask>())
    blocks = neighborhood::num_block_boxes(p.fwd.neighborhood, kBlockM);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.fwd.heads),
                  static_cast<unsigned>(p.fwd.batch));
  return detail_bwd::launch_checked(&backward_dq_kernel<T, kD, Policy>, "backward dQ", grid, kSmem,
                                    p, stream);
}

}  // namespace fmha::cuda::sm80
