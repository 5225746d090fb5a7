// The scratch memory of one CUDA call, from where its params' Workspace says (fmha/params.h): the
// caller's buffer, the caller's allocator, or fmha's stream-ordered pool (workspace_pool.h).
//
// A call plans its scratch bytes first (the same plan fmha::workspace_size reports), checks a
// caller's buffer against them with fits() before it queues anything, then takes its regions;
// memory from the pool goes back, in stream order, at release() (or when the object ends).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "fmha/params.h"
#include "fmha/status.h"

namespace fmha::cuda {

// Regions start on this alignment inside a caller's buffer, and planned sizes are rounded up to
// it, so that a plan of several regions fits the sum of their rounded sizes.
inline constexpr std::size_t kScratchAlignment = 256;
constexpr std::size_t scratch_round_up(std::size_t bytes) {
  return (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
}

class CallWorkspace {
 public:
  CallWorkspace(const Workspace& given, int device, cudaStream_t stream)
      : given_(given), device_(device), stream_(stream) {}
  CallWorkspace(const CallWorkspace&) = delete;
  CallWorkspace& operator=(const CallWorkspace&) = delete;
  ~CallWorkspace() { (void)release(); }

  // invalid_argument when the caller's buffer (if any) holds fewer than `planned` bytes or is not
  // 16-byte aligned; ok otherwise.
  Status fits(std::size_t planned) const;

  // `bytes` of scratch memory for the work the call queues on its stream (*out = nullptr for 0).
  Status take(std::size_t bytes, void** out);

  // Gives the pool's memory back in stream order; the first error.
  Status release();

 private:
  static constexpr int kMaxPoolBlocks = 4;
  Workspace given_;
  int device_;
  cudaStream_t stream_;
  std::size_t used_ = 0;  // of the caller's buffer
  void* pool_blocks_[kMaxPoolBlocks] = {};
  int pool_count_ = 0;
};

}  // namespace fmha::cuda
