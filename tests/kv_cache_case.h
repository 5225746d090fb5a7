// A KV-cache attention case on host buffers, shared by the CPU tests (test_kv_cache.cpp) and the
// CUDA tests (cuda/test_cuda_kv_cache.cpp): random keys per sequence, written into a contiguous
// cache or into a shuffled page pool, every other cache row and page NaN; and the oracle: naive
// float64 attention (tests/naive/) of each sequence and head over exactly its keys.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "fmha/fmha.h"
#include "test_util.h"

namespace fmha_test {

struct KvCase {
  DType dtype = DType::kFloat64;
  std::int64_t heads = 4, kv_heads = 2, head_dim = 16, value_dim = 16;
  std::vector<std::int32_t> cache_lens;  // keys per sequence (B = size)
  std::int64_t seqlen_q = 1;             // dense queries [B, Lq, H, D]
  std::vector<std::int32_t> q_lens;      // non-empty: packed queries with cu_seqlens_q
  std::int64_t page_size = 0;            // 0: contiguous cache
  fmha::AttentionOptions options;        // causal_alignment is set to kBottomRight by the case
  bool sinks = false;
  bool lse = true;

  std::int64_t batch() const { return static_cast<std::int64_t>(cache_lens.size()); }
  bool packed() const { return !q_lens.empty(); }
};

// The buffers of one case. Keys and values are drawn per sequence from `seed`, so the same case
// with another page_size (or a contiguous cache) holds the same numbers.
class KvCaseData {
 public:
  KvCaseData(const KvCase& c, std::uint64_t seed);

  // The call on these buffers (out and lse poisoned first).
  fmha::KvCacheForwardParams params();
  // The oracle (tests/naive/, independent of src/reference/): out and lse of each (sequence, head)
  // over exactly its keys, in this call's layout; out_lowp, when given, gets the same computation
  // with every intermediate rounded to the case's dtype (SPEC §13's baseline).
  void reference(std::vector<double>* out, std::vector<double>* lse,
                 std::vector<double>* out_lowp = nullptr) const;

  // Row of the cache tensors ([pages * page_rows, Hkv, *] flattened) holding token t of sequence b.
  std::int64_t cache_row(std::int64_t b, std::int64_t t) const;

  const KvCase& spec() const { return c_; }
  HostTensor q, k_cache, v_cache, block_table, cache_seqlens, cu_seqlens_q, sinks, out, lse;

 private:
  std::int64_t query_count(std::int64_t b) const;
  std::int64_t first_query(std::int64_t b) const;

  KvCase c_;
  std::int64_t page_rows_ = 0;                      // page_size, or Lcache_max when contiguous
  std::vector<std::vector<std::int64_t>> pages_;    // per sequence, the pages it uses
  std::vector<std::vector<double>> keys_, values_;  // per sequence [len, Hkv, D] / [len, Hkv, Dv]
};

// SPEC §13's bound for an output in `dtype`: fp64 1e-12, fp32 1e-5, fp16/bf16 2 x the error of the
// naive same-dtype computation `lowp` + the error of storing `ref` in the dtype + 1e-4.
double kv_tolerance(DType dtype, const std::vector<double>& ref, const std::vector<double>& lowp);

}  // namespace fmha_test
