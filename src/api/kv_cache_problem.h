// What validation learns about a KV-cache call (KvCacheForwardParams, KvCacheAppendParams): the
// attention sizes of the queries plus the geometry of the cache, resolved once for every backend.
#pragma once

#include <cstdint>

#include "api/problem.h"

namespace fmha::detail {

// A contiguous cache is read as a paged one with one page per sequence: page_size = Lcache_max,
// num_pages = B, max_pages = 1 and page b for sequence b. Backends address both the same way.
struct KvCacheGeometry {
  bool paged = false;
  std::int64_t page_size = 0;  // paged: rows per page; contiguous: Lcache_max
  std::int64_t num_pages = 0;  // paged: the pool's pages; contiguous: B
  std::int64_t max_pages = 0;  // paged: block_table's columns; contiguous: 1
  std::int64_t capacity = 0;   // keys one sequence can hold: max_pages * page_size
};

struct KvCacheShape {
  // Forward: the queries' sizes (layout kDense for q [B, Lq, H, D], kVarlen for packed q), with
  // seqlen_k = capacity. Append: batch, kv_heads, head_dim, value_dim only.
  ProblemShape attention;
  KvCacheGeometry cache;
  // Append: Lnew (dense new tokens) or total_new (packed).
  std::int64_t new_tokens = 0;
  bool packed_new = false;
};

}  // namespace fmha::detail
