// Attention over a KV cache (SPEC §16) on the CPU backend: against dense float64 attention of each
// sequence over exactly its keys, paged == contiguous bitwise, the append, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "kv_cache_case.h"

namespace fmha_test {
namespace {

// Runs the case and checks out / lse against the oracle; returns the data for further checks.
KvCaseData check_kv_case(const KvCase& c, std::uint64_t seed) {
  KvCaseData data(c, seed);
  const fmha::Status status = fmha::run(data.params());
  EXPECT_TRUE(status.ok()) << status.message();
  std::vector<double> out_ref, lse_ref, out_lowp;
  data.reference(&out_ref, &lse_ref, &out_lowp);
  EXPECT_TRUE(close("out", data.out.to_double(), out_ref, data.out.shape(),
                    kv_tolerance(c.dtype, out_ref, out_lowp)));
  if (c.lse) {
    EXPECT_TRUE(close("lse", data.lse.to_double(), lse_ref, data.lse.shape(), 1e-6));
  }
  return data;
}

// The same case on a contiguous cache and on pages of each size gives bitwise the same result.
void check_layouts_agree(KvCase c, std::uint64_t seed, std::initializer_list<std::int64_t> pages) {
  c.page_size = 0;
  const KvCaseData contiguous = check_kv_case(c, seed);
  for (std::int64_t page_size : pages) {
    c.page_size = page_size;
    const KvCaseData paged = check_kv_case(c, seed);
    EXPECT_TRUE(paged.out.bitwise_equal(contiguous.out)) << "page_size " << page_size;
    if (c.lse) {
      EXPECT_TRUE(paged.lse.bitwise_equal(contiguous.lse)) << "page_size " << page_size;
    }
  }
}

KvCase decode_case() {
  KvCase c;
  c.heads = 8;
  c.kv_heads = 2;
  c.head_dim = 40;
  c.value_dim = 24;
  c.cache_lens = {5, 0, 37, 16};
  c.seqlen_q = 1;
  c.options.causal = true;
  return c;
}

TEST(KvCache, DecodePagedEqualsContiguous) {
  check_layouts_agree(decode_case(), 1, {1, 3, 16, 256});
}

TEST(KvCache, DecodeEveryDtype) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    KvCase c = decode_case();
    c.dtype = dtype;
    check_layouts_agree(c, 2, {7});
  }
}

TEST(KvCache, ShortQueriesEveryFeature) {
  KvCase base;
  base.heads = 6;
  base.kv_heads = 3;
  base.head_dim = 24;
  base.value_dim = 8;
  base.cache_lens = {0, 3, 17, 40, 9};  // Lq 5 > 3 and 0 keys: fully masked rows
  base.seqlen_q = 5;
  std::uint64_t seed = 10;
  for (int feature = 0; feature < 8; ++feature) {
    KvCase c = base;
    switch (feature) {
      case 0: break;
      case 1: c.options.causal = true; break;
      case 2: c.options.window_left = 4; c.options.window_right = 0; break;
      case 3: c.options.causal = true; c.options.window_left = 2; break;
      case 4: c.options.window_left = 3; c.options.window_right = 2; break;
      case 5: c.options.softcap = 2.5f; c.options.scale = 0.7f; c.options.causal = true; break;
      case 6: c.sinks = true; c.options.causal = true; break;
      case 7: c.sinks = true; c.options.softcap = 1.5f; c.options.window_left = 6; break;
    }
    SCOPED_TRACE("feature " + std::to_string(feature));
    check_layouts_agree(c, ++seed, {4, 5});
  }
}

TEST(KvCache, HeadGroupings) {
  for (auto [heads, kv_heads] : {std::pair{4, 4}, std::pair{8, 1}, std::pair{6, 2}}) {
    KvCase c = decode_case();
    c.heads = heads;
    c.kv_heads = kv_heads;
    c.seqlen_q = 3;
    c.head_dim = 17;
    c.value_dim = 33;
    check_layouts_agree(c, 20 + heads, {2, 6});
  }
}

TEST(KvCache, PackedQueriesChunkedPrefill) {
  KvCase c;
  c.cache_lens = {9, 4, 7, 0, 30};
  c.q_lens = {2, 0, 7, 1, 11};  // 7 queries over 7 keys; 1 query over an empty cache
  c.options.causal = true;
  c.sinks = true;
  check_layouts_agree(c, 30, {1, 4, 8});
  c.options.window_left = 5;
  c.dtype = DType::kBFloat16;
  check_layouts_agree(c, 31, {3});
}

TEST(KvCache, EmptyCachesGiveZerosAndMinusInfinity) {
  KvCase c = decode_case();
  c.cache_lens = {0, 0};
  c.seqlen_q = 2;
  for (std::int64_t page_size : {0, 4}) {
    c.page_size = page_size;
    KvCaseData data = check_kv_case(c, 40);
    for (double x : data.out.to_double()) EXPECT_EQ(x, 0.0);
    for (double x : data.lse.to_double()) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
  }
  c.sinks = true;  // a sink alone: out 0, lse = the sink's logit
  KvCaseData data = check_kv_case(c, 41);
  for (double x : data.out.to_double()) EXPECT_EQ(x, 0.0);
  EXPECT_EQ(data.lse.at(0), data.sinks.at(0));
}

TEST(KvCache, WorkspaceIsZeroOnTheCpu) {
  KvCaseData data(decode_case(), 50);
  std::size_t bytes = 123;
  const fmha::Status status = fmha::workspace_size(data.params(), &bytes);
  EXPECT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(bytes, 0u);
}

// ---- Append -------------------------------------------------------------------------------------

// Appending the last tokens of each sequence and attending over the longer sequences equals the
// case whose cache already held them (same keys, same pages): the cache rows the append must write
// are NaN before it runs.
void check_append(const KvCase& full, const std::vector<std::int32_t>& old_lens, bool packed,
                  std::uint64_t seed) {
  const KvCaseData expected = check_kv_case(full, seed);
  KvCaseData data(full, seed);
  const std::int64_t B = full.batch(), Hkv = full.kv_heads, D = full.head_dim, Dv = full.value_dim;
  std::vector<std::int64_t> first_new(static_cast<std::size_t>(B + 1), 0);
  for (std::int64_t b = 0; b < B; ++b) {
    const auto i = static_cast<std::size_t>(b);
    first_new[i + 1] = first_new[i] + full.cache_lens[i] - old_lens[i];
  }
  const std::int64_t lnew = first_new[1];  // dense: every sequence appends as many
  const std::int64_t rows = packed ? first_new.back() : B * lnew;
  HostTensor k_new(full.dtype, packed ? std::vector<std::int64_t>{rows, Hkv, D}
                                      : std::vector<std::int64_t>{B, lnew, Hkv, D});
  HostTensor v_new(full.dtype, packed ? std::vector<std::int64_t>{rows, Hkv, Dv}
                                      : std::vector<std::int64_t>{B, lnew, Hkv, Dv});
  HostTensor cu_new;
  if (packed) {
    cu_new = HostTensor(DType::kInt32, {B + 1});
    for (std::int64_t b = 0; b <= B; ++b) cu_new.set(b, static_cast<double>(first_new[static_cast<std::size_t>(b)]));
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (std::int64_t b = 0; b < B; ++b) {
    const auto i = static_cast<std::size_t>(b);
    if (!packed) {
      ASSERT_EQ(full.cache_lens[i] - old_lens[i], lnew);
    }
    data.cache_seqlens.set(b, old_lens[i]);
    for (std::int64_t t = old_lens[i]; t < full.cache_lens[i]; ++t) {
      const std::int64_t row = data.cache_row(b, t), n = first_new[i] + t - old_lens[i];
      for (std::int64_t e = 0; e < Hkv * D; ++e) {
        k_new.set(n * Hkv * D + e, expected.k_cache.at(row * Hkv * D + e));
        data.k_cache.set(row * Hkv * D + e, nan);
      }
      for (std::int64_t e = 0; e < Hkv * Dv; ++e) {
        v_new.set(n * Hkv * Dv + e, expected.v_cache.at(row * Hkv * Dv + e));
        data.v_cache.set(row * Hkv * Dv + e, nan);
      }
    }
  }
  const fmha::KvCacheAppendParams append{.k_new = k_new.view(),
                                         .v_new = v_new.view(),
                                         .cu_seqlens_new = cu_new.view(),
                                         .k_cache = data.k_cache.view(),
                                         .v_cache = data.v_cache.view(),
                                         .block_table = data.block_table.view(),
                                         .cache_seqlens = data.cache_seqlens.view()};
  fmha::Status status = fmha::run(append);
  ASSERT_TRUE(status.ok()) << status.message();
  for (std::int64_t b = 0; b < B; ++b) data.cache_seqlens.set(b, full.cache_lens[static_cast<std::size_t>(b)]);
  status = fmha::run(data.params());
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_TRUE(data.out.bitwise_equal(expected.out));
  EXPECT_TRUE(data.lse.bitwise_equal(expected.lse));
}

TEST(KvCache, AppendThenAttend) {
  for (std::int64_t page_size : {0, 1, 3, 16}) {
    SCOPED_TRACE("page_size " + std::to_string(page_size));
    KvCase full = decode_case();
    full.page_size = page_size;
    full.cache_lens = {8, 3, 40, 4};
    check_append(full, {5, 0, 37, 1}, /*packed=*/false, 60);
    full.cache_lens = {8, 2, 37, 1};
    full.dtype = DType::kBFloat16;
    check_append(full, {5, 0, 32, 1}, /*packed=*/true, 61);
  }
}

// ---- Refusals -----------------------------------------------------------------------------------

::testing::AssertionResult refused(const fmha::Status& status, const std::string& needle) {
  if (status.ok()) return ::testing::AssertionFailure() << "accepted; expected a refusal naming " << needle;
  if (status.message().find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "message '" << status.message() << "' lacks '" << needle << "'";
  }
  return ::testing::AssertionSuccess();
}

KvCase paged_case() {
  KvCase c = decode_case();
  c.page_size = 4;
  return c;
}

TEST(KvCacheValidation, BadBlockTablesAndLengths) {
  KvCaseData data(paged_case(), 70);
  const std::int64_t pool = data.k_cache.shape()[0], max_pages = data.block_table.shape()[1];
  const double saved = data.block_table.at(2 * max_pages + 1);  // sequence 2 uses 10 pages
  for (double bad : {-1.0, static_cast<double>(pool), 1e6}) {
    data.block_table.set(2 * max_pages + 1, bad);
    EXPECT_TRUE(refused(fmha::check(data.params()), "block_table[2, 1]"));
    EXPECT_TRUE(data.out.poisoned());
    EXPECT_TRUE(refused(fmha::run(data.params()), "block_table[2, 1]"));
    EXPECT_TRUE(data.out.poisoned());
  }
  data.block_table.set(2 * max_pages + 1, saved);
  data.block_table.set(max_pages - 1, 1e6);  // sequence 0 uses 2 pages: the last entry is unused
  EXPECT_TRUE(fmha::check(data.params()).ok());
  data.cache_seqlens.set(1, -1);
  EXPECT_TRUE(refused(fmha::check(data.params()), "cache_seqlens[1] = -1"));
  data.cache_seqlens.set(1, static_cast<double>(max_pages * 4 + 1));
  EXPECT_TRUE(refused(fmha::check(data.params()), "exceeds the capacity"));
}

TEST(KvCacheValidation, ShapesDtypesAndOptions) {
  KvCaseData data(paged_case(), 71);
  fmha::KvCacheForwardParams p = data.params();
  HostTensor float_table(DType::kFloat32, data.block_table.shape());
  p.block_table = float_table.view();
  EXPECT_TRUE(refused(fmha::check(p), "block_table has dtype float32"));

  p = data.params();
  HostTensor big_pages(DType::kFloat64, {2, 300, 2, 40});
  p.k_cache = big_pages.view();
  EXPECT_TRUE(refused(fmha::check(p), "page_size 300"));

  p = data.params();
  HostTensor narrow_table(DType::kInt32, {3, 2});
  p.block_table = narrow_table.view();
  EXPECT_TRUE(refused(fmha::check(p), "q has batch 4 but the cache holds 3"));

  p = data.params();
  p.options.causal_alignment = fmha::CausalAlignment::kTopLeft;
  EXPECT_TRUE(refused(fmha::check(p), "kBottomRight"));

  p = data.params();
  HostTensor extra(DType::kFloat64, {4, 1, 2, 40});
  p.options.extra_k = extra.view();
  p.options.extra_v = extra.view();
  EXPECT_TRUE(refused(fmha::check(p), "options.extra_k is not accepted"));

  p = data.params();
  HostTensor cache_d(DType::kFloat64, {data.k_cache.shape()[0], 4, 2, 32});
  p.k_cache = cache_d.view();
  EXPECT_TRUE(refused(fmha::check(p), "q has head dim D = 40 but k_cache has D = 32"));

  p = data.params();
  p.num_splits = -2;
  EXPECT_TRUE(refused(fmha::check(p), "num_splits = -2"));
}

TEST(KvCacheValidation, AppendRefusesOverflowAndSharedPages) {
  KvCaseData data(paged_case(), 72);  // lengths {5, 0, 37, 16}, page_size 4
  const std::int64_t max_pages = data.block_table.shape()[1];
  HostTensor k_new(DType::kFloat64, {4, 1, 2, 40}), v_new(DType::kFloat64, {4, 1, 2, 24});
  std::mt19937_64 rng(1);
  k_new.fill_uniform(rng, -1, 1);
  fmha::KvCacheAppendParams p{.k_new = k_new.view(),
                              .v_new = v_new.view(),
                              .cu_seqlens_new = {},
                              .k_cache = data.k_cache.view(),
                              .v_cache = data.v_cache.view(),
                              .block_table = data.block_table.view(),
                              .cache_seqlens = data.cache_seqlens.view()};
  // Sequence 1 is empty and its first page is unassigned (-1): appending there is refused.
  EXPECT_TRUE(refused(fmha::check(p), "block_table[1, 0] = -1"));
  data.block_table.set(1 * max_pages, data.block_table.at(0));  // sequence 0's first page
  data.cache_seqlens.set(0, 3);  // sequence 0 now writes position 3, in that same page
  EXPECT_TRUE(refused(fmha::check(p), "is also written by sequence 0"));
  data.cache_seqlens.set(0, 5);  // back to page 1: no page is shared any more
  data.cache_seqlens.set(3, static_cast<double>(max_pages * 4));
  EXPECT_TRUE(refused(fmha::check(p), "new tokens exceeds the capacity"));
}

}  // namespace
}  // namespace fmha_test
