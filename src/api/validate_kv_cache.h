// Validation of the KV-cache entry points (SPEC §14, §16): shapes, dtypes and devices of every
// tensor, the cache geometry, and the contents of block_table, cache_seqlens and cu_seqlens when
// they are CPU tensors (CUDA ones are not read on the host; the kernels clamp, see kv_cache.h).
#pragma once

#include "api/kv_cache_problem.h"
#include "fmha/kv_cache.h"
#include "fmha/status.h"

namespace fmha::detail {

// The largest page a paged cache may have (SPEC §16: page sizes 1..256).
inline constexpr std::int64_t kMaxPageSize = 256;

Status validate(const KvCacheForwardParams& p, KvCacheShape* shape);
Status validate(const KvCacheAppendParams& p, KvCacheShape* shape);

}  // namespace fmha::detail
