#include "kv_cache_case.h"

#include <algorithm>
#include <cmath>
#include <cmath>
#include <numeric>

#include "naive/naive_attention.h"
#include "naive/naive_masks.h"

namespace fmha_test {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

std::vector<double> draw(std::mt19937_64& rng, std::int64_t n, DType dtype) {
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<double> values(static_cast<std::size_t>(n));
  for (double& x : values) x = round_to(dtype, uniform(rng));
  return values;
}

}  // namespace

KvCaseData::KvCaseData(const KvCase& c, std::uint64_t seed) : c_(c) {
  c_.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
  const std::int64_t B = c.batch(), Hkv = c.kv_heads, D = c.head_dim, Dv = c.value_dim;
  std::mt19937_64 rng(seed);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = c.cache_lens[static_cast<std::size_t>(b)];
    keys_.push_back(draw(rng, len * Hkv * D, c.dtype));
    values_.push_back(draw(rng, len * Hkv * Dv, c.dtype));
  }

  // Queries.
  std::int64_t total_q = B * c.seqlen_q;
  if (c.packed()) {
    total_q = std::accumulate(c.q_lens.begin(), c.q_lens.end(), std::int64_t{0});
    cu_seqlens_q = HostTensor(DType::kInt32, {B + 1});
    std::int64_t offset = 0;
    for (std::int64_t b = 0; b <= B; ++b) {
      cu_seqlens_q.set(b, static_cast<double>(offset));
      if (b < B) offset += c.q_lens[static_cast<std::size_t>(b)];
    }
    q = HostTensor(c.dtype, {total_q, c.heads, D});
    out = HostTensor(c.dtype, {total_q, c.heads, Dv});
    if (c.lse) lse = HostTensor(DType::kFloat32, {c.heads, total_q});
  } else {
    q = HostTensor(c.dtype, {B, c.seqlen_q, c.heads, D});
    out = HostTensor(c.dtype, {B, c.seqlen_q, c.heads, Dv});
    if (c.lse) lse = HostTensor(DType::kFloat32, {B, c.heads, c.seqlen_q});
  }
  q.fill_uniform(rng, -1.0, 1.0);
  if (c.sinks) {
    sinks = HostTensor(DType::kFloat32, {c.heads});
    sinks.fill_uniform(rng, -1.0, 2.0);
  }

  // The cache: every row NaN first, then each sequence's keys where its positions map to.
  cache_seqlens = HostTensor(DType::kInt32, {B});
  const std::int64_t longest =
      c.cache_lens.empty() ? 0 : *std::max_element(c.cache_lens.begin(), c.cache_lens.end());
  pages_.assign(static_cast<std::size_t>(B), {});
  if (c.page_size > 0) {
    const std::int64_t ps = c.page_size;
    std::int64_t used = 0;
    for (std::int32_t len : c.cache_lens) used += ceil_div(len, ps);
    const std::int64_t pool = used + 2;  // spare pages stay NaN
    std::vector<std::int64_t> order(static_cast<std::size_t>(pool));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const std::int64_t max_pages = ceil_div(longest, ps) + 1;
    block_table = HostTensor(DType::kInt32, {B, max_pages});
    std::size_t next = 0;
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t p = 0; p < max_pages; ++p) {
        const bool used_page = p < ceil_div(c.cache_lens[static_cast<std::size_t>(b)], ps);
        const std::int64_t page = used_page ? order[next++] : -1;  // -1: never read
        if (used_page) pages_[static_cast<std::size_t>(b)].push_back(page);
        block_table.set(b * max_pages + p, static_cast<double>(page));
      }
    }
    k_cache = HostTensor(c.dtype, {pool, ps, Hkv, D});
    v_cache = HostTensor(c.dtype, {pool, ps, Hkv, Dv});
  } else {
    k_cache = HostTensor(c.dtype, {B, longest + 3, Hkv, D});
    v_cache = HostTensor(c.dtype, {B, longest + 3, Hkv, Dv});
  }
  k_cache.poison();
  v_cache.poison();
  page_rows_ = c.page_size > 0 ? c.page_size : longest + 3;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = c.cache_lens[static_cast<std::size_t>(b)];
    cache_seqlens.set(b, static_cast<double>(len));
    const std::vector<double>& keys = keys_[static_cast<std::size_t>(b)];
    const std::vector<double>& values = values_[static_cast<std::size_t>(b)];
    for (std::int64_t t = 0; t < len; ++t) {
      const std::int64_t row = cache_row(b, t);
      for (std::int64_t h = 0; h < Hkv; ++h) {
        for (std::int64_t d = 0; d < D; ++d)
          k_cache.set((row * Hkv + h) * D + d, keys[static_cast<std::size_t>((t * Hkv + h) * D + d)]);
        for (std::int64_t d = 0; d < Dv; ++d)
          v_cache.set((row * Hkv + h) * Dv + d,
                      values[static_cast<std::size_t>((t * Hkv + h) * Dv + d)]);
      }
    }
  }
}

std::int64_t KvCaseData::cache_row(std::int64_t b, std::int64_t t) const {
  if (c_.page_size == 0) return b * page_rows_ + t;
  const auto& pages = pages_[static_cast<std::size_t>(b)];
  return pages[static_cast<std::size_t>(t / page_rows_)] * page_rows_ + t % page_rows_;
}

std::int64_t KvCaseData::query_count(std::int64_t b) const {
  return c_.packed() ? c_.q_lens[static_cast<std::size_t>(b)] : c_.seqlen_q;
}

std::int64_t KvCaseData::first_query(std::int64_t b) const {
  return c_.packed() ? static_cast<std::int64_t>(cu_seqlens_q.at(b)) : b * c_.seqlen_q;
}

fmha::KvCacheForwardParams KvCaseData::params() {
  out.poison();
  if (lse.defined()) lse.poison();
  fmha::KvCacheForwardParams p{.q = q.view(),
                               .cu_seqlens_q = cu_seqlens_q.view(),
                               .max_seqlen_q = 0,
                               .k_cache = k_cache.view(),
                               .v_cache = v_cache.view(),
                               .block_table = block_table.view(),
                               .cache_seqlens = cache_seqlens.view(),
                               .out = out.view(),
                               .lse = lse.view(),
                               .options = c_.options};
  if (c_.packed()) {
    p.max_seqlen_q = *std::max_element(c_.q_lens.begin(), c_.q_lens.end());
  }
  p.options.sinks = sinks.view();
  return p;
}

// The rounding of every stored intermediate of a same-dtype implementation (SPEC §13's baseline).
double round_fp16(double x) { return round_to(DType::kFloat16, x); }
double round_bf16(double x) { return round_to(DType::kBFloat16, x); }

void KvCaseData::reference(std::vector<double>* out_ref, std::vector<double>* lse_ref,
                           std::vector<double>* out_lowp) const {
  const std::int64_t H = c_.heads, Hkv = c_.kv_heads, D = c_.head_dim, Dv = c_.value_dim;
  const std::int64_t total_q = q.shape()[0] * (c_.packed() ? 1 : c_.seqlen_q);
  out_ref->assign(static_cast<std::size_t>(total_q * H * Dv), 0.0);
  lse_ref->assign(static_cast<std::size_t>(total_q * H), 0.0);
  if (out_lowp != nullptr) out_lowp->assign(out_ref->size(), 0.0);
  const naive::Round round = c_.dtype == DType::kFloat16    ? round_fp16
                             : c_.dtype == DType::kBFloat16 ? round_bf16
                                                            : naive::exact;
  // The scale as the library resolves it: a float, 1 / sqrt(D) by default.
  const float scale = c_.options.scale ? *c_.options.scale : 1.0f / std::sqrt(static_cast<float>(D));
  const std::vector<double> q_all = q.to_double();
  const std::vector<double> sink_values = c_.sinks ? sinks.to_double() : std::vector<double>{};
  for (std::int64_t b = 0; b < c_.batch(); ++b) {
    const std::int64_t lq = query_count(b), first = first_query(b);
    const std::int64_t lk = c_.cache_lens[static_cast<std::size_t>(b)];
    const std::vector<double>& keys = keys_[static_cast<std::size_t>(b)];
    const std::vector<double>& values = values_[static_cast<std::size_t>(b)];
    naive::HeadInputs in;
    in.num_keys = lk;
    in.visible = naive::attention_mask(lq, lk, c_.options.causal, /*bottom_right=*/true,
                                       c_.options.window_left, c_.options.window_right);
    in.scale = scale;
    in.softcap = c_.options.softcap;
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t kv = h / (H / Hkv);
      in.q = naive::Matrix(lq, D);
      in.k = naive::Matrix(lk, D);
      in.v = naive::Matrix(lk, Dv);
      for (std::int64_t i = 0; i < lq; ++i)
        for (std::int64_t d = 0; d < D; ++d) in.q(i, d) = q_all[static_cast<std::size_t>(((first + i) * H + h) * D + d)];
      for (std::int64_t t = 0; t < lk; ++t) {
        for (std::int64_t d = 0; d < D; ++d) in.k(t, d) = keys[static_cast<std::size_t>((t * Hkv + kv) * D + d)];
        for (std::int64_t d = 0; d < Dv; ++d) in.v(t, d) = values[static_cast<std::size_t>((t * Hkv + kv) * Dv + d)];
      }
      in.has_sink = c_.sinks;
      in.sink = c_.sinks ? sink_values[static_cast<std::size_t>(h)] : 0.0;
      const naive::HeadForward exact = naive::head_forward(in, naive::exact);
      naive::HeadForward lowp;
      if (out_lowp != nullptr) lowp = naive::head_forward(in, round);
      for (std::int64_t i = 0; i < lq; ++i) {
        for (std::int64_t d = 0; d < Dv; ++d) {
          const auto at = static_cast<std::size_t>(((first + i) * H + h) * Dv + d);
          (*out_ref)[at] = exact.out(i, d);
          if (out_lowp != nullptr) (*out_lowp)[at] = lowp.out(i, d);
        }
        // lse: [B, H, Lq] dense, [H, total_q] packed.
        const std::int64_t at = c_.packed() ? h * total_q + first + i : (b * H + h) * c_.seqlen_q + i;
        (*lse_ref)[static_cast<std::size_t>(at)] = exact.lse[static_cast<std::size_t>(i)];
      }
    }
  }
}

double kv_tolerance(DType dtype, const std::vector<double>& ref, const std::vector<double>& lowp) {
  return tolerance(dtype, ref, lowp, dtype);
}

}  // namespace fmha_test
