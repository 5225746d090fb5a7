// Attention over a KV cache on the sm90 forward kernel (kv_cache_forward.h), in its KV-cache
// policies (PolicyCache, PolicyCacheSoftcap). The queries are the forward's dense or varlen
// queries; the keys of sequence b are the first cache_seqlens[b] rows of its cache
// (ForwardParams::seqused_k), through the block table when the cache is paged
// (ForwardParams::block_table): key tiles by TMA, a page's box at a time where pages hold a power
// of two of at least 8 rows, else gathered row by row with cp.async. Masks are bottom-right, as the
// KV-cache API requires, so the forward's own alignment does the rest.
#include "cuda/kv_cache_forward.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/forward_params.h"
#include "cuda/common/kernel_attributes.h"
#include "cuda/device_guard.h"
#include "cuda/dispatch_fwd.h"
#include "cuda/forward_setup.h"
#include "cuda/head_dim_buckets.h"
#include "cuda/sm80/tile_sizes.h"

namespace fmha::cuda {
namespace {

// log2(page_size) where the page size is a power of two (the gather's short path), else -1.
int page_shift_of(std::int64_t page_size) {
  for (int shift = 0; shift < 31; ++shift) {
    if ((std::int64_t{1} << shift) == page_size) return shift;
  }
  return -1;
}

ForwardParams cache_forward_params(const KvCacheForwardParams& a, const detail::KvCacheShape& shape) {
  const detail::ProblemShape& s = shape.attention;
  const detail::KvCacheGeometry& g = shape.cache;
  ForwardParams p;
  fill_forward_sizes(s, &p);  // seqlen_k: the capacity
  const bool packed = a.cu_seqlens_q.defined();
  p.q = a.q.data;
  p.out = a.out.data;
  if (packed) {  // [total_q, H, D]: sequence b's rows start at cu_seqlens_q[b]
    p.q_row_stride = a.q.stride[0], p.q_head_stride = a.q.stride[1];
    p.out_row_stride = a.out.stride[0], p.out_head_stride = a.out.stride[1];
    p.cu_seqlens_q = static_cast<const std::int32_t*>(a.cu_seqlens_q.data);
  } else {
    p.q_batch_stride = a.q.stride[0], p.q_row_stride = a.q.stride[1];
    p.q_head_stride = a.q.stride[2];
    p.out_batch_stride = a.out.stride[0], p.out_row_stride = a.out.stride[1];
    p.out_head_stride = a.out.stride[2];
  }
  if (a.lse.defined()) {
    p.lse = static_cast<float*>(a.lse.data);
    if (packed) {  // [H, total_q]
      p.lse_head_stride = a.lse.stride[0];
      p.lse_row_stride = a.lse.stride[1];
    } else {  // [B, H, Lq]
      p.lse_batch_stride = a.lse.stride[0];
      p.lse_head_stride = a.lse.stride[1];
      p.lse_row_stride = a.lse.stride[2];
    }
  }
  p.k = a.k_cache.data;
  p.v = a.v_cache.data;
  p.k_row_stride = a.k_cache.stride[1], p.k_head_stride = a.k_cache.stride[2];
  p.v_row_stride = a.v_cache.stride[1], p.v_head_stride = a.v_cache.stride[2];
  if (g.paged) {
    p.block_table = static_cast<const std::int32_t*>(a.block_table.data);
    p.table_batch_stride = a.block_table.stride[0];
    p.table_page_stride = a.block_table.stride[1];
    p.page_size = static_cast<int>(g.page_size);
    p.page_shift = page_shift_of(g.page_size);
    p.num_pages = g.num_pages;
  } else {
    p.k_batch_stride = a.k_cache.stride[0];
    p.v_batch_stride = a.v_cache.stride[0];
  }
  p.seqused_k = static_cast<const std::int32_t*>(a.cache_seqlens.data);
  p.seqused_k_stride = a.cache_seqlens.stride[0];
  fill_forward_options(a.options, s, &p);
  fill_forward_alignment(a.q, a.k_cache, a.v_cache, a.out, a.options, &p);
  return p;
}

Workspace caller_workspace(const KvCacheForwardParams& a) {
  Workspace w;
  w.data = a.workspace;
  w.bytes = a.workspace != nullptr ? a.workspace_bytes : 0;
  return w;
}

}  // namespace

bool kv_cache_forward_applies(const KvCacheForwardParams& p, const detail::KvCacheShape& shape) {
  const detail::ProblemShape& s = shape.attention;
  const detail::KvCacheGeometry& g = shape.cache;
  int arch = 0;
  if (compute_capability(p.q.device.index, &arch) != cudaSuccess || !use_sm90_kernels(arch)) {
    return false;
  }
  const int dims = static_cast<int>(s.head_dim > s.value_dim ? s.head_dim : s.value_dim);
  if (!head_dim_bucket_built(sm80::head_dim_bucket(dims))) return false;
  if (s.heads > kMaxGridYZ || s.batch > kMaxGridYZ) return false;
  if (g.paged) {
    // Rows of the pool are numbered page * page_size + row, a sequence's keys counted, and rows'
    // and table entries' offsets taken, in 32 bits (sm90/tiles.cuh: load_paged_rows_async), rows
    // one stride apart.
    constexpr std::int64_t k32 = std::int64_t{1} << 31;
    if (g.num_pages * g.page_size >= k32 || s.seqlen_k >= k32) return false;
    if (p.k_cache.stride[1] >= k32 || p.v_cache.stride[1] >= k32) return false;
    if (g.max_pages * p.block_table.stride[1] >= k32) return false;
    if (p.k_cache.stride[0] != g.page_size * p.k_cache.stride[1] ||
        p.v_cache.stride[0] != g.page_size * p.v_cache.stride[1]) {
      return false;
    }
  }
  return true;
}

bool kv_cache_forward_preferred(const detail::KvCacheShape& shape) {
  // Where the forward (a 128-row query tile a head) beats the split kernel, which packs a group's
  // heads into its rows: H200, bf16, GQA 32 / 8, D 128 (2026-11-29, docs/perf-log.md; forward /
  // split, ms). By query rows a sequence, B 8 over 8192 keys: contiguous caches and pages of a
  // power-of-two size from 64 (contiguous 0.224 / 0.329, pages of 64 0.229 / 0.358; at 32 0.222 /
  // 0.191 and 0.227 / 0.204), other page sizes, whose gather divides a row, from 128. By the
  // forward's grid, over 32k keys: with 32 tiles of 128 (query, head) rows or fewer the split
  // kernel wins (B 1 at 128 rows 0.411 / 0.324, B 2 at 64 rows 0.413 / 0.324), from 48 the forward
  // (B 1 at 192 rows 0.412 / 0.556, B 2 at 128 0.412 / 0.593, B 4 at 64 over 16k keys 0.219 /
  // 0.328). On average over the sequences: a batch of decode steps with one long prefill among
  // them (packed queries) keeps the split kernel, which reads each sequence's keys once a kv head.
  const detail::ProblemShape& s = shape.attention;
  const detail::KvCacheGeometry& g = shape.cache;
  const std::int64_t rows = g.paged && page_shift_of(g.page_size) < 0 ? 128 : 64;
  constexpr std::int64_t kSplitWinsUpTo = 32 * 128;  // (query, head) rows
  return s.total_q >= rows * s.batch && s.total_q * s.heads > kSplitWinsUpTo;
}

Status kv_cache_forward_workspace(const KvCacheForwardParams& p, const detail::KvCacheShape& shape,
                                  std::size_t* bytes) {
  return forward_workspace_bytes(cache_forward_params(p, shape), p.q, bytes);
}

Status run_kv_cache_forward(const KvCacheForwardParams& p, const detail::KvCacheShape& shape,
                            void* stream) {
  return launch_forward_kernel(cache_forward_params(p, shape), p.q, caller_workspace(p), stream);
}

}  // namespace fmha::cuda
