// Validation of attention over a KV cache and of the append into it (SPEC §14, §16). The shared
// checks (head sizes, options, outputs) are those of validate_attention.h; what is new here is the
// cache geometry and the host-side checks of the index tensors.
#include "api/validate_kv_cache.h"

#include <cstdint>
#include <unordered_map>

#include "api/validate_attention.h"
#include "api/validate_message.h"
#include "api/validate_tensor.h"

namespace fmha::detail {
namespace {

// Reads element i of a 1-D or element (row, col) of a 2-D int32 CPU tensor.
std::int64_t index_at(const TensorView& t, std::int64_t i) {
  return static_cast<const std::int32_t*>(t.data)[i * t.stride[0]];
}
std::int64_t index_at(const TensorView& t, std::int64_t row, std::int64_t col) {
  return static_cast<const std::int32_t*>(t.data)[row * t.stride[0] + col * t.stride[1]];
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// The cache's geometry and batch size from k_cache (and block_table when paged); checks v_cache's
// leading sizes against k_cache and reads Hkv, D, Dv into *s.
Status resolve_cache(const TensorView& k_cache, const TensorView& v_cache,
                     const TensorView& block_table, KvCacheShape* shape) {
  KvCacheGeometry& g = shape->cache;
  ProblemShape& s = shape->attention;
  g.paged = block_table.defined();
  const char* k_layout = g.paged ? "[num_pages, page_size, Hkv, D]" : "[B, Lcache_max, Hkv, D]";
  const char* v_layout = g.paged ? "[num_pages, page_size, Hkv, Dv]" : "[B, Lcache_max, Hkv, Dv]";
  FMHA_RETURN_IF_ERROR(expect_rank(v_cache, "v_cache", 4, v_layout));
  (void)k_layout;  // k_cache's rank was checked by the caller (it may be the anchor)
  s.kv_heads = k_cache.size(2);
  s.head_dim = k_cache.size(3);
  s.value_dim = v_cache.size(3);
  if (g.paged) {
    FMHA_RETURN_IF_ERROR(expect_rank(block_table, "block_table", 2, "[B, max_pages_per_seq]"));
    g.num_pages = k_cache.size(0);
    g.page_size = k_cache.size(1);
    g.max_pages = block_table.size(1);
    s.batch = block_table.size(0);
    if (g.page_size < 1 || g.page_size > kMaxPageSize) {
      return invalid("k_cache has page_size ", g.page_size, " (dimension 1 of shape ",
                     k_cache.shape_string(), "); expected a page size 1..", kMaxPageSize);
    }
    if (!checked_mul(g.max_pages, g.page_size, &g.capacity)) {
      return invalid("block_table has ", g.max_pages, " pages per sequence of ", g.page_size,
                     " rows, more than 2^63 positions; the capacity must fit in int64");
    }
  } else {
    s.batch = k_cache.size(0);
    g.page_size = k_cache.size(1);
    g.num_pages = s.batch;
    g.max_pages = 1;
    g.capacity = g.page_size;
  }
  return Status::ok_status();
}

Shape cache_shape(const KvCacheShape& shape, bool values) {
  const KvCacheGeometry& g = shape.cache;
  const ProblemShape& s = shape.attention;
  const Dim features = values ? Dim{"Dv", s.value_dim} : Dim{"D", s.head_dim};
  if (g.paged) {
    return {{"num_pages", g.num_pages}, {"page_size", g.page_size}, {"Hkv", s.kv_heads}, features};
  }
  return {{"B", s.batch}, {"Lcache_max", g.page_size}, {"Hkv", s.kv_heads}, features};
}

// k_cache, v_cache, block_table and cache_seqlens against the resolved geometry.
Status check_cache_tensors(const Anchor& a, const TensorView& k_cache, const TensorView& v_cache,
                           const TensorView& block_table, const TensorView& cache_seqlens,
                           const KvCacheShape& shape, Access cache_access) {
  const ProblemShape& s = shape.attention;
  FMHA_RETURN_IF_ERROR(
      expect_data_tensor(a, k_cache, "k_cache", cache_shape(shape, false), cache_access));
  FMHA_RETURN_IF_ERROR(
      expect_data_tensor(a, v_cache, "v_cache", cache_shape(shape, true), cache_access));
  if (shape.cache.paged) {
    FMHA_RETURN_IF_ERROR(expect_index_tensor(
        a, block_table, "block_table", {{"B", s.batch}, {"max_pages_per_seq", shape.cache.max_pages}}));
  }
  FMHA_RETURN_IF_ERROR(expect_given(cache_seqlens, "cache_seqlens",
                                    "expected [B] int32, the tokens held by each sequence"));
  return expect_index_tensor(a, cache_seqlens, "cache_seqlens", {{"B", s.batch}});
}

// Sequence b's pages first_page .. end_page - 1 exist in the pool (block_table on the CPU).
Status check_pages(const TensorView& block_table, const KvCacheGeometry& g, std::int64_t b,
                   std::int64_t first_page, std::int64_t end_page, std::int64_t tokens) {
  for (std::int64_t p = first_page; p < end_page; ++p) {
    const std::int64_t page = index_at(block_table, b, p);
    if (page >= 0 && page < g.num_pages) continue;
    return invalid("block_table[", b, ", ", p, "] = ", page, " but the cache has ", g.num_pages,
                   " pages; sequence ", b, " uses pages 0..", end_page - 1, " of its row (",
                   tokens, " tokens), each must be in 0..", g.num_pages - 1);
  }
  return Status::ok_status();
}

// 0 <= cache_seqlens[b] (+ new tokens) <= capacity, for a CPU cache_seqlens.
Status check_length(std::int64_t b, std::int64_t length, std::int64_t added,
                    const KvCacheGeometry& g) {
  if (length < 0) {
    return invalid("cache_seqlens[", b, "] = ", length, "; expected a length >= 0");
  }
  if (length + added <= g.capacity) return Status::ok_status();
  const char* capacity = g.paged ? "max_pages_per_seq * page_size" : "Lcache_max";
  if (added == 0) {
    return invalid("cache_seqlens[", b, "] = ", length, " exceeds the capacity ", g.capacity,
                   " (", capacity, "); expected 0..", g.capacity);
  }
  return invalid("cache_seqlens[", b, "] = ", length, " plus ", added,
                 " new tokens exceeds the capacity ", g.capacity, " (", capacity,
                 "); every appended position must fit in the cache");
}

// Attention reads keys 0 .. cache_seqlens[b] - 1: their lengths and pages.
Status check_cache_contents(const TensorView& block_table, const TensorView& cache_seqlens,
                            const KvCacheShape& shape) {
  if (cache_seqlens.device.type != DeviceType::kCPU) return Status::ok_status();
  const KvCacheGeometry& g = shape.cache;
  for (std::int64_t b = 0; b < shape.attention.batch; ++b) {
    const std::int64_t length = index_at(cache_seqlens, b);
    FMHA_RETURN_IF_ERROR(check_length(b, length, 0, g));
    if (g.paged) {
      FMHA_RETURN_IF_ERROR(check_pages(block_table, g, b, 0, ceil_div(length, g.page_size), length));
    }
  }
  return Status::ok_status();
}

// The options attention over a cache does not take, refused before anything else reads them.
Status check_kv_cache_options(const AttentionOptions& o) {
  const char* refused = o.bias.defined()      ? "options.bias"
                        : o.rel_h.defined()   ? "options.rel_h"
                        : o.rel_w.defined()   ? "options.rel_w"
                        : o.extra_k.defined() ? "options.extra_k"
                        : o.extra_v.defined() ? "options.extra_v"
                                              : nullptr;
  if (refused != nullptr) {
    return invalid(refused,
                   " is not accepted by attention over a KV cache (it takes scale, softcap, "
                   "causal, window_left / window_right and sinks)");
  }
  const bool masked = o.causal || o.window_left != -1 || o.window_right != -1;
  if (masked && o.causal_alignment != CausalAlignment::kBottomRight) {
    return invalid("options.causal_alignment = ",
                   o.causal_alignment == CausalAlignment::kTopLeft ? "kTopLeft" : "(not an alignment)",
                   " with a causal mask or window over a KV cache; the queries are the last Lq "
                   "positions of each sequence, so masks are bottom-right: set "
                   "CausalAlignment::kBottomRight");
  }
  return Status::ok_status();
}

Status check_workspace(const KvCacheForwardParams& p) {
  if (p.num_splits < 0) {
    return invalid("num_splits = ", p.num_splits, "; expected 0 (chosen by the library) or >= 1");
  }
  constexpr std::uintptr_t kWorkspaceAlignment = 16;
  if (p.workspace != nullptr &&
      reinterpret_cast<std::uintptr_t>(p.workspace) % kWorkspaceAlignment != 0) {
    return invalid("workspace = ", p.workspace, " is not aligned to ", kWorkspaceAlignment,
                   " bytes; expected a pointer from an allocator (aligned to 16 bytes or more)");
  }
  return Status::ok_status();
}

// Packed rows: cu_seqlens [B + 1] starting at 0, non-decreasing, ending at `rows`, each run at
// most max_run long (CPU tensors only).
Status check_packed_offsets(const TensorView& cu, const char* name, std::int64_t rows,
                            const char* rows_of, std::int64_t max_run, const char* max_name) {
  if (cu.device.type != DeviceType::kCPU) return Status::ok_status();
  const std::int64_t batch = cu.size(0) - 1;
  if (index_at(cu, 0) != 0) {
    return invalid(name, "[0] = ", index_at(cu, 0), "; expected 0 (the first run starts at row 0)");
  }
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t run = index_at(cu, b + 1) - index_at(cu, b);
    if (run < 0) {
      return invalid(name, "[", b + 1, "] = ", index_at(cu, b + 1), " is less than ", name, "[",
                     b, "] = ", index_at(cu, b), "; offsets must be non-decreasing");
    }
    if (run > max_run) {
      return invalid("sequence ", b, " has ", run, " rows (", name, "[", b + 1, "] - ", name, "[",
                     b, "]) but ", max_name, " = ", max_run, "; expected every run <= ", max_name);
    }
  }
  if (index_at(cu, batch) != rows) {
    return invalid(name, "[", batch, "] = ", index_at(cu, batch), " but ", rows_of, " has ", rows,
                   " rows; the last offset must equal the row count");
  }
  return Status::ok_status();
}

// q [B, Lq, H, D] or packed q [total_q, H, D] with cu_seqlens_q.
Status resolve_queries(const KvCacheForwardParams& p, const Anchor& a, ProblemShape* s) {
  const bool packed = p.cu_seqlens_q.defined();
  s->heads = p.q.size(-2);
  if (s->head_dim != p.q.size(-1)) {
    return invalid("q has head dim D = ", p.q.size(-1), " but k_cache has D = ", s->head_dim,
                   "; q and k_cache must share D");
  }
  FMHA_RETURN_IF_ERROR(check_head_sizes(*s));
  if (!packed) {
    s->layout = Layout::kDense;
    if (p.q.size(0) != s->batch) {
      return invalid("q has batch ", p.q.size(0), " but the cache holds ", s->batch,
                     " sequences; expected q [B, Lq, H, D] with the cache's B");
    }
    s->seqlen_q = p.q.size(1);
    s->total_q = s->batch * s->seqlen_q;
    return Status::ok_status();
  }
  s->layout = Layout::kVarlen;
  if (p.max_seqlen_q < 0) {
    return invalid("max_seqlen_q = ", p.max_seqlen_q, "; expected a value >= 0");
  }
  s->seqlen_q = p.max_seqlen_q;
  s->total_q = p.q.size(0);
  FMHA_RETURN_IF_ERROR(expect_rank(p.cu_seqlens_q, "cu_seqlens_q", 1, "[B + 1]"));
  FMHA_RETURN_IF_ERROR(
      expect_index_tensor(a, p.cu_seqlens_q, "cu_seqlens_q", {{"B + 1", s->batch + 1}}));
  return check_packed_offsets(p.cu_seqlens_q, "cu_seqlens_q", s->total_q, "q", s->seqlen_q,
                              "max_seqlen_q");
}

}  // namespace

Status validate(const KvCacheForwardParams& p, KvCacheShape* shape) {
  const AttentionOptions& o = p.options;
  FMHA_RETURN_IF_ERROR(expect_valid_ranks({{&p.q, "q"},
                                           {&p.cu_seqlens_q, "cu_seqlens_q"},
                                           {&p.k_cache, "k_cache"},
                                           {&p.v_cache, "v_cache"},
                                           {&p.block_table, "block_table"},
                                           {&p.cache_seqlens, "cache_seqlens"},
                                           {&p.out, "out"},
                                           {&p.lse, "lse"}}));
  FMHA_RETURN_IF_ERROR(check_option_ranks(o));
  FMHA_RETURN_IF_ERROR(check_kv_cache_options(o));
  const bool packed = p.cu_seqlens_q.defined();
  FMHA_RETURN_IF_ERROR(
      expect_anchor(p.q, "q", packed ? 3 : 4, packed ? "[total_q, H, D]" : "[B, Lq, H, D]"));
  const Anchor a{"q", p.q.dtype, p.q.device};
  FMHA_RETURN_IF_ERROR(expect_rank(p.k_cache, "k_cache", 4,
                                   p.block_table.defined() ? "[num_pages, page_size, Hkv, D]"
                                                           : "[B, Lcache_max, Hkv, D]"));
  KvCacheShape result;
  FMHA_RETURN_IF_ERROR(resolve_cache(p.k_cache, p.v_cache, p.block_table, &result));
  ProblemShape& s = result.attention;
  FMHA_RETURN_IF_ERROR(resolve_queries(p, a, &s));
  s.seqlen_k = result.cache.capacity;
  s.total_k = 0;
  FMHA_RETURN_IF_ERROR(expect_data_tensor(a, p.q, "q", q_shape(s), Access::kInput));
  FMHA_RETURN_IF_ERROR(check_cache_tensors(a, p.k_cache, p.v_cache, p.block_table,
                                           p.cache_seqlens, result, Access::kInput));
  FMHA_RETURN_IF_ERROR(check_options(a, o, &s));
  FMHA_RETURN_IF_ERROR(check_forward_outputs(a, p.out, p.lse, s));
  FMHA_RETURN_IF_ERROR(check_workspace(p));
  FMHA_RETURN_IF_ERROR(check_cache_contents(p.block_table, p.cache_seqlens, result));
  *shape = result;
  return Status::ok_status();
}

Status validate(const KvCacheAppendParams& p, KvCacheShape* shape) {
  FMHA_RETURN_IF_ERROR(expect_valid_ranks({{&p.k_new, "k_new"},
                                           {&p.v_new, "v_new"},
                                           {&p.cu_seqlens_new, "cu_seqlens_new"},
                                           {&p.k_cache, "k_cache"},
                                           {&p.v_cache, "v_cache"},
                                           {&p.block_table, "block_table"},
                                           {&p.cache_seqlens, "cache_seqlens"}}));
  const bool paged = p.block_table.defined();
  FMHA_RETURN_IF_ERROR(expect_anchor(
      p.k_cache, "k_cache", 4, paged ? "[num_pages, page_size, Hkv, D]" : "[B, Lcache_max, Hkv, D]"));
  const Anchor a{"k_cache", p.k_cache.dtype, p.k_cache.device};
  KvCacheShape result;
  FMHA_RETURN_IF_ERROR(resolve_cache(p.k_cache, p.v_cache, p.block_table, &result));
  ProblemShape& s = result.attention;
  s.heads = s.kv_heads;
  FMHA_RETURN_IF_ERROR(check_head_sizes(s));
  FMHA_RETURN_IF_ERROR(check_cache_tensors(a, p.k_cache, p.v_cache, p.block_table,
                                           p.cache_seqlens, result, Access::kOutput));

  // The new tokens: [B, Lnew, Hkv, *] or packed [total_new, Hkv, *] with cu_seqlens_new.
  result.packed_new = p.cu_seqlens_new.defined();
  const Dim hkv{"Hkv", s.kv_heads}, d{"D", s.head_dim}, dv{"Dv", s.value_dim};
  if (result.packed_new) {
    FMHA_RETURN_IF_ERROR(expect_rank(p.k_new, "k_new", 3, "[total_new, Hkv, D]"));
    result.new_tokens = p.k_new.size(0);
    const Dim rows{"total_new", result.new_tokens};
    FMHA_RETURN_IF_ERROR(expect_data_tensor(a, p.k_new, "k_new", {rows, hkv, d}, Access::kInput));
    FMHA_RETURN_IF_ERROR(expect_data_tensor(a, p.v_new, "v_new", {rows, hkv, dv}, Access::kInput));
    FMHA_RETURN_IF_ERROR(expect_rank(p.cu_seqlens_new, "cu_seqlens_new", 1, "[B + 1]"));
    FMHA_RETURN_IF_ERROR(
        expect_index_tensor(a, p.cu_seqlens_new, "cu_seqlens_new", {{"B + 1", s.batch + 1}}));
    FMHA_RETURN_IF_ERROR(check_packed_offsets(p.cu_seqlens_new, "cu_seqlens_new",
                                              result.new_tokens, "k_new", result.cache.capacity,
                                              "the cache capacity"));
  } else {
    FMHA_RETURN_IF_ERROR(expect_rank(p.k_new, "k_new", 4, "[B, Lnew, Hkv, D]"));
    result.new_tokens = p.k_new.size(1);
    const Dim b{"B", s.batch}, lnew{"Lnew", result.new_tokens};
    FMHA_RETURN_IF_ERROR(
        expect_data_tensor(a, p.k_new, "k_new", {b, lnew, hkv, d}, Access::kInput));
    FMHA_RETURN_IF_ERROR(
        expect_data_tensor(a, p.v_new, "v_new", {b, lnew, hkv, dv}, Access::kInput));
  }

  // Host-side contents: every written position fits, its page exists, and no page is written by
  // two sequences (their writes would race on a GPU).
  if (p.cache_seqlens.device.type == DeviceType::kCPU) {
    const KvCacheGeometry& g = result.cache;
    std::unordered_map<std::int64_t, std::int64_t> writer;  // page -> sequence
    for (std::int64_t b = 0; b < s.batch; ++b) {
      const std::int64_t length = index_at(p.cache_seqlens, b);
      const std::int64_t added =
          result.packed_new ? index_at(p.cu_seqlens_new, b + 1) - index_at(p.cu_seqlens_new, b)
                            : result.new_tokens;
      FMHA_RETURN_IF_ERROR(check_length(b, length, added, g));
      if (!g.paged || added == 0) continue;
      const std::int64_t first = length / g.page_size, end = ceil_div(length + added, g.page_size);
      FMHA_RETURN_IF_ERROR(check_pages(p.block_table, g, b, first, end, length + added));
      for (std::int64_t page_index = first; page_index < end; ++page_index) {
        const std::int64_t page = index_at(p.block_table, b, page_index);
        const auto [it, inserted] = writer.emplace(page, b);
        if (inserted || it->second == b) continue;
        return invalid("block_table[", b, ", ", page_index, "] = ", page, " is also written by ",
                       "sequence ", it->second, "; pages an append writes must belong to one "
                       "sequence");
      }
    }
  }
  *shape = result;
  return Status::ok_status();
}

}  // namespace fmha::detail
