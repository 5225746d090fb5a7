// Attention over a KV cache on the dense sm90 forward kernel (kv_cache_forward.cu): prefill and
// chunked prefill, whose queries fill the forward's 128-row tiles, read the cache through its
// lengths and block table instead of running the decode kernel (kv_cache_mma.cuh), whose tiles
// hold at most 64 (query, head) rows.
#pragma once

#include <cstddef>

#include "api/kv_cache_problem.h"
#include "fmha/kv_cache.h"
#include "fmha/status.h"

namespace fmha::cuda {

// Whether the call can run on the sm90 forward on this device: Hopper kernels in this build and
// process, its head-dim bucket built, grid limits, and a paged cache whose pages lie page_size
// rows apart (as [num_pages, page_size, Hkv, D] tensors do). Host data only.
bool kv_cache_forward_applies(const KvCacheForwardParams& p, const detail::KvCacheShape& shape);

// Whether the library's choice (no kernel forced) runs it there: enough query rows a sequence on
// average that the forward beats the split kernel (32 over a contiguous cache, 64 over pages of a
// power-of-two size, 128 over other pages).
bool kv_cache_forward_preferred(const detail::KvCacheShape& shape);

// Scratch bytes of the call on the forward (its tile counter), which the caller's workspace must
// hold for the call to run there.
Status kv_cache_forward_workspace(const KvCacheForwardParams& p, const detail::KvCacheShape& shape,
                                  std::size_t* bytes);

// The call on the forward, its scratch from p.workspace (at least kv_cache_forward_workspace bytes).
Status run_kv_cache_forward(const KvCacheForwardParams& p, const detail::KvCacheShape& shape,
                            void* stream);

}  // namespace fmha::cuda
