// The CPU reference of the KV-cache entry points (SPEC §16): the cache's keys of each sequence are
// gathered, in float64, into one packed key tensor, and the generic attention core
// (attention_core.h) runs over it, so a paged and a contiguous cache give bitwise the same result.
#pragma once

#include "api/kv_cache_problem.h"
#include "fmha/kv_cache.h"

namespace fmha::reference {

void run(const KvCacheForwardParams& p, const detail::KvCacheShape& shape);
void run(const KvCacheAppendParams& p, const detail::KvCacheShape& shape);

}  // namespace fmha::reference
