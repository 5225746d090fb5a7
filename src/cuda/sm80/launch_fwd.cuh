// Definition of sm80::launch_forward; included only by the instantiation files.
#pragma once

#include <string>

#include "cuda/sm80/launch_fwd.h"
#include "cuda/sm80/launch_smem.cuh"
#include "cuda/sm80/mainloop_fwd.cuh"

namespace fmha::cuda::sm80 {

template <typename T, int kD, typename Policy>
Status launch_forward(const ForwardParams& p, cudaStream_t stream) {
  constexpr int kM = block_m<T>(kD);
  constexpr bool kTokenTiles = Policy::Mask::kTokenTiles;
  // Token tiles keep their bookkeeping after the K/V tiles.
  constexpr int kSmem =
      smem_bytes<T>(kD) +
      (kTokenTiles ? static_cast<int>(sizeof(TokenTileSmem<kM, block_n<T>(kD)>)) : 0);
  // Every variant fits the 99 KB of sm86/sm89 but the fp32 neighborhood one at bucket 256 (its
  // bookkeeping tips it over by about 1 KB): request_shared_memory refuses that one there.
  static_assert(kSmem <= kPortableSmemBytes || (sizeof(T) == 4 && kTokenTiles && kD == 256),
                "sm86/sm89 allow at most 99 KB per block");
  constexpr auto* kernel = &forward_kernel<T, kD, Policy>;
  FMHA_RETURN_IF_ERROR(request_shared_memory<kernel>("forward", kSmem));
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
