#include <cstdint>
#include <string>

#include "cuda/call_workspace.h"
#include "cuda/workspace_pool.h"

namespace fmha::cuda {

Status CallWorkspace::fits(std::size_t planned) const {
  if (given_.data == nullptr) return Status::ok_status();
  if (reinterpret_cast<std::uintptr_t>(given_.data) % 16 != 0) {
    return Status::invalid_argument(
        "fmha: workspace.data must be 16-byte aligned; got an address that is " +
        std::to_string(reinterpret_cast<std::uintptr_t>(given_.data) % 16) +
        " bytes past a multiple of 16");
  }
  if (given_.bytes < planned) {
    return Status::invalid_argument("fmha: workspace.bytes is " + std::to_string(given_.bytes) +
                                    " but this call takes " + std::to_string(planned) +
                                    " bytes of scratch memory (fmha::workspace_size says how "
                                    "many; or leave workspace.data null)");
  }
  return Status::ok_status();
}

Status CallWorkspace::take(std::size_t bytes, void** out) {
  *out = nullptr;
  if (bytes == 0) return Status::ok_status();
  if (given_.data != nullptr) {
    const std::size_t start = scratch_round_up(used_);
    if (start + bytes > given_.bytes) {
      return Status::backend_error(
          "fmha: the call took more scratch memory than its plan (an internal error)");
    }
    *out = static_cast<char*>(given_.data) + start;
    used_ = start + bytes;
    return Status::ok_status();
  }
  if (given_.allocate != nullptr) {
    *out = given_.allocate(given_.context, bytes);
    if (*out == nullptr) {
      return Status::backend_error("fmha: the workspace allocator returned no memory for " +
                                   std::to_string(bytes) + " bytes");
    }
    if (reinterpret_cast<std::uintptr_t>(*out) % 16 != 0) {
      *out = nullptr;
      return Status::backend_error(
          "fmha: the workspace allocator returned memory that is not 16-byte aligned");
    }
    return Status::ok_status();
  }
  if (pool_count_ == kMaxPoolBlocks) {
    return Status::backend_error("fmha: the call took more scratch regions than it may (an "
                                 "internal error)");
  }
  const cudaError_t e = workspace_malloc_async(out, bytes, device_, stream_);
  if (e != cudaSuccess) {
    *out = nullptr;
    return Status::backend_error("fmha: cudaMallocAsync of " + std::to_string(bytes) +
                                 " bytes of scratch memory failed: " + cudaGetErrorString(e));
  }
  pool_blocks_[pool_count_++] = *out;
  return Status::ok_status();
}

Status CallWorkspace::release() {
  cudaError_t first = cudaSuccess;
  for (int i = 0; i < pool_count_; ++i) {
    const cudaError_t e = cudaFreeAsync(pool_blocks_[i], stream_);
    if (first == cudaSuccess) first = e;
  }
  pool_count_ = 0;
  if (first == cudaSuccess) return Status::ok_status();
  return Status::backend_error(std::string("fmha: cudaFreeAsync of scratch memory failed: ") +
                               cudaGetErrorString(first));
}

}  // namespace fmha::cuda
