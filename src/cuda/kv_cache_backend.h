// The CUDA backend of the KV-cache entry points (include/fmha/kv_cache.h), called by
// src/api/dispatch_kv_cache.cpp after validation.
#pragma once

#include <cstddef>

#include "api/kv_cache_problem.h"
#include "fmha/kv_cache.h"
#include "fmha/status.h"

namespace fmha::cuda {

Status run(const KvCacheForwardParams& p, const detail::KvCacheShape& shape, void* stream);
Status run(const KvCacheAppendParams& p, const detail::KvCacheShape& shape, void* stream);
Status kv_cache_workspace_size(const KvCacheForwardParams& p, const detail::KvCacheShape& shape,
                               std::size_t* bytes);

}  // namespace fmha::cuda
