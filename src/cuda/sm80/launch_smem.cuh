// Shared-memory opt-in of the sm80 launches: a kernel that needs more than the default 48 KB per
// block must ask for it, and fp32 variants of the largest head dims need more than the 99 KB that
// every sm80+ GPU allows (tile_sizes_bwd.h): those are refused with a message on GPUs that allow
// less, instead of failing the launch. The device's limit and the kernel's opt-in are asked of the
// driver once per device (kernel_attributes.h).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/common/kernel_attributes.h"
#include "fmha/status.h"

namespace fmha::cuda::sm80 {

template <auto kKernel>
Status request_shared_memory(const char* name, int smem_bytes) {
  constexpr int kDefaultSmemLimit = 48 * 1024;  // beyond it a kernel must opt in
  if (smem_bytes <= kDefaultSmemLimit) return Status::ok_status();
  int device = 0, limit = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) {
    e = smem_optin_limit(device, &limit);
  }
  if (e != cudaSuccess) {
    return Status::backend_error(std::string("fmha: cudaDeviceGetAttribute failed: ") +
                                 cudaGetErrorString(e));
  }
  if (smem_bytes > limit) {
    return Status::not_supported(
        std::string("fmha: the CUDA ") + name +
        " kernel (sm80) for this dtype and head dim needs " + std::to_string(smem_bytes) +
        " bytes of shared memory per block; this GPU allows " + std::to_string(limit) +
        " (float32 at head dims above 128 needs the shared memory of an sm80 or sm90 GPU, its "
        "backward at head dims above 224 an sm90 GPU; 16-bit dtypes fit every sm80+ GPU)");
  }
  e = allow_dynamic_smem<kKernel>(smem_bytes);
  if (e != cudaSuccess) {
    return Status::backend_error(std::string("fmha: CUDA ") + name +
                                 " kernel (sm80) could not get " + std::to_string(smem_bytes) +
                                 " bytes of shared memory: " + cudaGetErrorString(e));
  }
  return Status::ok_status();
}

}  // namespace fmha::cuda::sm80
