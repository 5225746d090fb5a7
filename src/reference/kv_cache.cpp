// Attention over a KV cache on the CPU: gather, then the generic core. Gathering into float64 is
// exact for every storage dtype, so the core sees the same numbers whatever the cache layout.
#include "reference/kv_cache.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "reference/attention_core.h"
#include "reference/tensor_access.h"

namespace fmha::reference {
namespace {

std::int64_t index_at(const TensorView& t, std::int64_t i) {
  return static_cast<const std::int32_t*>(t.data)[i * t.stride[0]];
}

// Where token t of sequence b lives in a cache tensor [pages, page_size, Hkv, *]: element offset of
// (t, head 0, feature 0). A contiguous cache is one page per sequence.
class CacheRows {
 public:
  CacheRows(const TensorView& block_table, const detail::KvCacheGeometry& g)
      : block_table_(block_table), geometry_(g) {}

  std::int64_t offset(const TensorView& cache, std::int64_t b, std::int64_t t) const {
    std::int64_t page = b, row = t;
    if (geometry_.paged) {
      page = block_table_.data == nullptr
                 ? 0
                 : static_cast<const std::int32_t*>(
                       block_table_.data)[b * block_table_.stride[0] +
                                          (t / geometry_.page_size) * block_table_.stride[1]];
      row = t % geometry_.page_size;
    }
    return page * cache.stride[0] + row * cache.stride[1];
  }

 private:
  const TensorView& block_table_;
  const detail::KvCacheGeometry& geometry_;
};

// The keys (or values) of every sequence, packed: [sum of cache_seqlens, Hkv, features] float64.
struct PackedKeys {
  std::vector<double> data;
  TensorView view;
};

PackedKeys gather(const TensorView& cache, const CacheRows& rows,
                  const std::vector<std::int64_t>& first_key, std::int64_t kv_heads) {
  const std::int64_t features = cache.shape[3];
  const std::int64_t batch = static_cast<std::int64_t>(first_key.size()) - 1;
  PackedKeys packed;
  packed.data.resize(static_cast<std::size_t>(first_key.back() * kv_heads * features));
  double* out = packed.data.data();
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < first_key[static_cast<std::size_t>(b + 1)] -
                                     first_key[static_cast<std::size_t>(b)];
         ++t) {
      const std::int64_t base = rows.offset(cache, b, t);
      for (std::int64_t h = 0; h < kv_heads; ++h) {
        for (std::int64_t d = 0; d < features; ++d) {
          *out++ = load(cache, base + h * cache.stride[2] + d * cache.stride[3]);
        }
      }
    }
  }
  packed.view = TensorView::contiguous(packed.data.data(), DType::kFloat64,
                                       {first_key.back(), kv_heads, features});
  return packed;
}

// Rows of a token-major tensor [tokens, H, features] (or lse-like [H, tokens] when lse) starting
// at token `first` along dimension token_dim.
TokenRows rows_of(const TensorView& t, std::int64_t base, std::int64_t token_stride,
                  std::int64_t head_stride, std::int64_t feature_stride, std::int64_t count) {
  TokenRows rows;
  rows.view = &t;
  if (!t.defined()) return rows;
  rows.base = base;
  rows.extent[0] = count;
  rows.stride[0] = token_stride;
  rows.head_stride = head_stride;
  rows.feature_stride = feature_stride;
  return rows;
}

}  // namespace

void run(const KvCacheForwardParams& p, const detail::KvCacheShape& shape) {
  const detail::ProblemShape& s = shape.attention;
  const bool packed_q = s.layout == detail::Layout::kVarlen;
  std::vector<std::int64_t> first_key(static_cast<std::size_t>(s.batch + 1), 0);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    first_key[static_cast<std::size_t>(b + 1)] =
        first_key[static_cast<std::size_t>(b)] + index_at(p.cache_seqlens, b);
  }
  const CacheRows cache_rows(p.block_table, shape.cache);
  const PackedKeys keys = gather(p.k_cache, cache_rows, first_key, s.kv_heads);
  const PackedKeys values = gather(p.v_cache, cache_rows, first_key, s.kv_heads);

  const AttentionOptions& o = p.options;
  AttentionProblem problem;
  problem.num_sequences = s.batch;
  problem.heads = s.heads;
  problem.kv_heads = s.kv_heads;
  problem.head_dim = s.head_dim;
  problem.value_dim = s.value_dim;
  problem.scale = s.scale;
  problem.softcap = o.softcap;
  problem.sinks = o.sinks.defined() ? &o.sinks : nullptr;
  problem.sequence = [&](std::int64_t b) {
    const std::int64_t first_q = packed_q ? index_at(p.cu_seqlens_q, b) : 0;
    const std::int64_t len_q = packed_q ? index_at(p.cu_seqlens_q, b + 1) - first_q : s.seqlen_q;
    const std::int64_t key0 = first_key[static_cast<std::size_t>(b)];
    const std::int64_t len_k = first_key[static_cast<std::size_t>(b + 1)] - key0;
    SequenceView seq;
    seq.len_q = len_q;
    seq.len_k = len_k;
    const auto queries = [&](const TensorView& t) {  // q, out: [B, Lq, H, *] or [total_q, H, *]
      if (!t.defined()) return rows_of(t, 0, 0, 0, 0, 0);
      return packed_q ? rows_of(t, first_q * t.stride[0], t.stride[0], t.stride[1], t.stride[2], len_q)
                      : rows_of(t, b * t.stride[0], t.stride[1], t.stride[2], t.stride[3], len_q);
    };
    seq.q = queries(p.q);
    seq.out = queries(p.out);
    if (p.lse.defined()) {  // [B, H, Lq] or [H, total_q]
      seq.lse = packed_q ? rows_of(p.lse, first_q * p.lse.stride[1], p.lse.stride[1], p.lse.stride[0], 0, len_q)
                         : rows_of(p.lse, b * p.lse.stride[0], p.lse.stride[2], p.lse.stride[1], 0, len_q);
    } else {
      seq.lse.view = &p.lse;
    }
    const auto cached = [&](const PackedKeys& k) {
      const TensorView& t = k.view;
      return rows_of(t, key0 * t.stride[0], t.stride[0], t.stride[1], t.stride[2], len_k);
    };
    seq.k = cached(keys);
    seq.v = cached(values);
    seq.visibility = Visibility::band(len_q, len_k, o.causal, CausalAlignment::kBottomRight,
                                      o.window_left, o.window_right);
    return seq;
  };
  attention_forward(problem);
}

void run(const KvCacheAppendParams& p, const detail::KvCacheShape& shape) {
  const detail::ProblemShape& s = shape.attention;
  const CacheRows cache_rows(p.block_table, shape.cache);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const std::int64_t first = shape.packed_new ? index_at(p.cu_seqlens_new, b) : 0;
    const std::int64_t count =
        shape.packed_new ? index_at(p.cu_seqlens_new, b + 1) - first : shape.new_tokens;
    const std::int64_t length = index_at(p.cache_seqlens, b);
    for (std::int64_t n = 0; n < count; ++n) {
      // Row n of sequence b in k_new / v_new: [B, Lnew, Hkv, *] or [total_new, Hkv, *].
      const auto source = [&](const TensorView& t) {
        return shape.packed_new ? (first + n) * t.stride[0] : b * t.stride[0] + n * t.stride[1];
      };
      const int head_dim = shape.packed_new ? 1 : 2;
      for (const auto& [from, to] : {std::pair{&p.k_new, &p.k_cache}, std::pair{&p.v_new, &p.v_cache}}) {
        const std::int64_t src = source(*from), dst = cache_rows.offset(*to, b, length + n);
        for (std::int64_t h = 0; h < s.kv_heads; ++h) {
          for (std::int64_t d = 0; d < to->shape[3]; ++d) {
            store(*to, dst + h * to->stride[2] + d * to->stride[3],
                  load(*from, src + h * from->stride[head_dim] + d * from->stride[head_dim + 1]));
          }
        }
      }
    }
  }
}

}  // namespace fmha::reference
