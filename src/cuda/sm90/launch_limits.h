// Host-side questions both sm90 launchers (forward and backward) ask before sizing shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "cuda/common/env_switch.h"
#include "cuda/common/forward_params.h"
#include "cuda/common/kernel_attributes.h"

namespace fmha::cuda::sm90 {

// Shared memory a block may opt into on the current device (asked once per device).
inline int max_block_smem() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess || smem_optin_limit(device, &bytes) != cudaSuccess) {
    return 0;
  }
  return bytes;
}

// Blocks of a persistent kernel that keeps one block an SM: the current device's SMs (asked once
// per device). The
// environment's FMHA_SM90_PERSISTENT (read once) overrides it, for measuring and testing: 0 is a
// block a tile, N > 0 at most N blocks (so that the GPU tests' small grids give each block
// several tiles).
inline std::int64_t persistent_blocks() {
  static const long long override_blocks = [] {
    const char* value = std::getenv("FMHA_SM90_PERSISTENT");
    return value != nullptr && *value != '\0' ? std::atoll(value) : -1LL;
  }();
  constexpr std::int64_t kUnlimited = std::int64_t{1} << 32;
  if (override_blocks >= 0) return override_blocks == 0 ? kUnlimited : override_blocks;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || sm_count(device, &sms) != cudaSuccess || sms <= 0) {
    return kUnlimited;
  }
  return sms;
}

// FMHA_SM90_DYNAMIC_TILES=1 (read once): every persistent forward with more tiles than blocks takes
// them one by one from the counter, as unequal tiles always do (launch_forward). For measuring: a
// block that starts late, behind another stream's kernel on its SM (a collective's transfer
// during context parallelism), then leaves its share to the blocks already running.
inline bool dynamic_tiles_requested() {
  static const bool requested = switched_on_by_env("FMHA_SM90_DYNAMIC_TILES");
  return requested;
}

// Whether a persistent forward (a copy warpgroup) takes its tiles one by one from a counter, when
// it has more tiles than blocks: under tiles of unequal work (a window, causal included, varlen
// sequences or a KV cache's lengths) or when asked. The counter lives in the call's scratch memory
// (forward.cu sizes it).
inline bool forward_tiles_dynamic(const ForwardParams& p) {
  return p.window_left != kUnboundedWindow || p.window_right != kUnboundedWindow ||
         p.cu_seqlens_q != nullptr || p.seqused_k != nullptr || dynamic_tiles_requested();
}

// Whether the bias rows can be copied 16 bytes at a time: keys contiguous, every (b, h, row)
// start 16-byte aligned, and Lk a multiple of 8 (no partial chunk at a row's end; dense only,
// since varlen sequences have their own lengths).
inline bool bias_stageable(const ForwardParams& p) {
  return p.bias != nullptr && p.cu_seqlens_q == nullptr && p.seqlen_k % 8 == 0 &&
         p.bias_stride[3] == 1 && p.bias_stride[0] % 8 == 0 && p.bias_stride[1] % 8 == 0 &&
         p.bias_stride[2] % 8 == 0 && reinterpret_cast<std::uintptr_t>(p.bias) % 16 == 0;
}

}  // namespace fmha::cuda::sm90
