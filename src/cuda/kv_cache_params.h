// Kernel arguments of attention over a KV cache (kv_cache.cu fills them from validated views; the
// kernels are in kv_cache_kernels.cuh). Plain data, int64 strides in elements.
//
// Every index the kernels read from device memory (cache_seqlens, block_table, cu_seqlens_q,
// cu_seqlens_new) is clamped or checked against the extents below before it addresses anything, so
// bad device data never reads or writes outside the tensors (SPEC §16).
#pragma once

#include <cstdint>

namespace fmha::cuda {

// Where the rows of one query-side tensor live: element (b, i, h, feature) of q / out, or (b, h, i)
// of lse, is at b * batch + token * row + h * head + feature, where token = i for q [B, Lq, H, *]
// and token = cu_seqlens_q[b] + i (batch = 0) for packed queries.
struct QueryRows {
  std::int64_t batch = 0, row = 0, head = 0;
};

// A cache tensor [pages, page_size, Hkv, *]; a contiguous cache is one page per sequence.
struct CacheTensor {
  const void* data = nullptr;
  std::int64_t page = 0, row = 0, head = 0;
};

struct KvCacheKernelParams {
  // Queries, outputs.
  const void* q = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // null when not requested
  QueryRows q_rows, out_rows, lse_rows;
  const std::int32_t* cu_seqlens_q = nullptr;  // null: dense queries
  std::int64_t cu_stride = 0;
  std::int64_t seqlen_q = 0;  // dense: Lq; packed: max_seqlen_q (a sequence's run is cut to it)
  std::int64_t total_q = 0;   // rows of q: B * Lq, or total_q when packed
  bool q_vector_loads = false;  // every query row 16-byte aligned with D a multiple of 8

  // The cache.
  CacheTensor k, v;
  const std::int32_t* block_table = nullptr;  // null: contiguous cache
  std::int64_t table_batch = 0, table_page = 0;
  const std::int32_t* cache_seqlens = nullptr;
  std::int64_t seqlens_stride = 0;
  std::int64_t page_size = 0;  // contiguous: Lcache_max
  std::int64_t num_pages = 0;  // contiguous: B
  std::int64_t capacity = 0;   // keys one sequence holds at most
  bool vector_loads = false;   // every K / V row 16-byte aligned with D, Dv multiples of 8

  // Sizes and options.
  int batch = 0, heads = 0, kv_heads = 0, group = 0;  // group = H / Hkv
  int head_dim = 0, value_dim = 0;
  int row_tiles = 0;  // tiles of kRows (query, head-in-group) rows per (b, kv head)
  float scale = 1.0f;
  float softcap = 0.0f;  // 0: off
  bool has_upper = false, has_lower = false;  // key j visible to position p iff
  std::int64_t upper = 0, lower = 0;          // p - lower <= j <= p + upper (each when present)
  const float* sinks = nullptr;
  std::int64_t sinks_stride = 0;

  // Split-KV: with num_splits > 1 each split writes its normalised partial out (float) and lse
  // (log2 units) to the workspace, rows numbered token * H + h, and the combine kernel merges them.
  int num_splits = 1;
  float* partial_out = nullptr;  // [num_splits, total_q * H, Dv]
  float* partial_lse = nullptr;  // [num_splits, total_q * H]
};

// The append (KvCacheAppendParams): new token n of sequence b goes to position cache_seqlens[b] + n.
struct KvCacheAppendKernelParams {
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  std::int64_t k_new_batch = 0, k_new_row = 0, k_new_head = 0;  // dense: batch, token; packed:
  std::int64_t v_new_batch = 0, v_new_row = 0, v_new_head = 0;  // batch 0, row = total_new index
  const std::int32_t* cu_seqlens_new = nullptr;  // null: dense new tokens
  std::int64_t cu_stride = 0;
  std::int64_t new_tokens = 0;  // dense: Lnew; packed: total_new
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  std::int64_t k_page = 0, k_row = 0, k_head = 0, v_page = 0, v_row = 0, v_head = 0;
  const std::int32_t* block_table = nullptr;
  std::int64_t table_batch = 0, table_page = 0;
  const std::int32_t* cache_seqlens = nullptr;
  std::int64_t seqlens_stride = 0;
  std::int64_t page_size = 0, num_pages = 0, max_pages = 0, capacity = 0;
  int batch = 0, kv_heads = 0, head_dim = 0, value_dim = 0;
};

}  // namespace fmha::cuda
