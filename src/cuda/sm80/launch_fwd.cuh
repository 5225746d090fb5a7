// Definition of sm80::launch_forward; included only by the instantiation files.
#pragma once

#include <string>

#include "cuda/sm80/launch_fwd.h"
#include "cuda/sm80/mainloop_fwd.cuh"

namespace fmha::cuda::sm80 {

template <typename T, int kD, typename Policy>
Status launch_forward(const ForwardParams& p, cudaStream_t stream) {
  constexpr int kM = block_m(kD);
  constexpr bool kTokenTiles = Policy::Mask::kTokenTiles;
  // Token tiles keep their bookkeeping after the K/V tiles.
  constexpr int kSmem =
      smem_bytes(kD) + (kTokenTiles ? static_cast<int>(sizeof(TokenTileSmem<kM, block_n(kD)>)) : 0);
  static_assert(kSmem <= 99 * 1024, "sm86/sm89 allow at most 99 KB per block");
  constexpr int kDefaultSmemLimit = 48 * 1024;  // beyond it a kernel must opt in
  auto* kernel = &forward_kernel<T, kD, Policy>;
  if (kSmem > kDefaultSmemLimit) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (e != cudaSuccess) {
      return Status::backend_error(std::string("fmha: CUDA forward kernel (sm80) could not get ") +
                                   std::to_string(kSmem) +
                                   " bytes of shared memory: " + cudaGetErrorString(e));
    }
  }
  std::int64_t blocks = (p.seqlen_q + kM - 1) / kM;
  if constexpr (kTokenTiles) blocks = neighborhood::num_block_boxes(p.neighborhood, kM);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>(p.batch));
  kernel<<<grid, kThreads, kSmem, stream>>>(p);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    return Status::backend_error(std::string("fmha: CUDA forward kernel (sm80) launch failed: ") +
                                 cudaGetErrorString(e));
  }
  return Status::ok_status();
}

}  // namespace fmha::cuda::sm80
