// Definition of sm90::launch_forward; included only by the instantiation files.
#pragma once

#include <string>

#include "cuda/sm90/launch_fwd.h"
#include "cuda/sm90/mainloop_fwd.cuh"

namespace fmha::cuda::sm90 {

template <typename T, int kD, typename Policy>
Status launch_forward(const ForwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = smem_bytes<kD>();
  auto* kernel = &forward_kernel<T, kD, Policy>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) {
    return Status::backend_error(std::string("fmha: CUDA forward kernel (sm90) could not get ") +
                                 std::to_string(kSmem) +
                                 " bytes of shared memory: " + cudaGetErrorString(e));
  }
  const dim3 grid(static_cast<unsigned>((p.seqlen_q + kBlockM - 1) / kBlockM),
                  static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
  kernel<<<grid, kThreads, kSmem, stream>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess) {
    return Status::backend_error(std::string("fmha: CUDA forward kernel (sm90) launch failed: ") +
                                 cudaGetErrorString(e));
  }
  return Status::ok_status();
}

}  // namespace fmha::cuda::sm90
