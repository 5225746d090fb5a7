// Dense attention against the naive oracle: sequence lengths, head dims, head counts (GQA / MQA),
// memory layouts and dtypes. Options (masks, bias, ...) are covered in test_options.cpp.
#include <cmath>
#include <iterator>

#include "test_case.h"

namespace fmha_test {
namespace {

TEST(Dense, SequenceLengths) {
  for (std::int64_t lq : {0, 1, 17, 113})
    for (std::int64_t lk : {0, 1, 17, 113}) {
      AttentionCase c;
      c.batch = 2;
      c.heads = 2;
      c.kv_heads = 1;
      c.head_dim = 40;
      c.value_dim = 24;
      c.seqlen_q = lq;
      c.seqlen_k = lk;
      check_case(c, static_cast<std::uint64_t>(lq * 1000 + lk));
    }
}

TEST(Dense, SequenceLengthsCausalBottomRight) {
  for (std::int64_t lq : {1, 17, 113})
    for (std::int64_t lk : {1, 17, 113}) {
      AttentionCase c;
      c.heads = 2;
      c.kv_heads = 2;
      c.seqlen_q = lq;
      c.seqlen_k = lk;
      c.options.causal = true;
      c.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
      check_case(c, static_cast<std::uint64_t>(lq * 1000 + lk));
    }
}

// A forward that asks for out alone (no lse), with every score option and each layout kind.
TEST(Dense, ForwardWithoutLse) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64})
    for (Kind kind : {Kind::kDense, Kind::kVarlen}) {
      AttentionCase c;
      c.kind = kind;
      c.dtype = dt;
      c.heads = 4;
      c.kv_heads = 2;
      c.seqlen_q = 17;
      c.seqlen_k = 23;
      c.seqlens_q = {5, 0, 17};
      c.seqlens_k = {9, 3, 23};
      c.options.causal = true;
      c.options.softcap = 20.0f;
      c.bias.given = kind == Kind::kDense;
      c.sinks = true;
      c.extra = 2;
      c.lse_output = false;
      c.backward = false;
      check_case(c, 301 + static_cast<std::uint64_t>(dt) * 10 + static_cast<std::uint64_t>(kind));
    }
}

// A backward given a bias, rel-pos, sinks and extra keys but asked for dq, dk and dv only: the
// inputs still shape the scores, and no gradient of theirs is written anywhere.
TEST(Dense, BackwardWithoutInputGradients) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat64}) {
    AttentionCase c;
    c.dtype = dt;
    c.heads = 2;
    c.kv_heads = 1;
    c.seqlen_q = 13;
    c.seqlen_k = 12;
    c.bias.given = true;
    c.rel_hk = 3;
    c.sinks = true;
    c.extra = 3;
    c.dlse = true;
    c.input_grads = false;
    check_case(c, 311 + static_cast<std::uint64_t>(dt));
    c.kind = Kind::kVarlen;
    c.bias.given = false;
    c.rel_hk = 0;
    c.seqlens_q = {4, 9};
    c.seqlens_k = {7, 1};
    check_case(c, 321 + static_cast<std::uint64_t>(dt));
  }
}

// The stored outputs of fp16 / bf16 problems are the exact values rounded to nearest (SPEC §13):
// four keys of equal score average their values, which sit 1/4 or 3/4 of a unit in the last place
// between two representable numbers, where rounding to nearest, truncation and rounding up all
// give different answers.
TEST(Dense, LowPrecisionStoresRoundToNearest) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const double ulp = dt == DType::kBFloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
    // Per value column: the four keys' values in ulps above 1 (times the sign), and the rounded
    // average, likewise.
    struct Column {
      double sign;
      int ulps[4];
      int rounded;
    };
    const Column columns[] = {{1, {0, 0, 0, 1}, 0}, {1, {0, 1, 1, 1}, 1}, {-1, {0, 1, 1, 1}, 1},
                              {-1, {0, 0, 0, 1}, 0}, {1, {2, 2, 2, 3}, 2}, {1, {2, 3, 3, 3}, 3}};
    const std::int64_t dv = std::size(columns), lk = 4;
    HostTensor q(dt, {1, 1, 1, 8}), k(dt, {1, lk, 1, 8}), v(dt, {1, lk, 1, dv});
    HostTensor out(dt, {1, 1, 1, dv});
    for (std::int64_t i = 0; i < q.numel(); ++i) q.set(i, 0.0);  // every score 0: P = 1/4
    for (std::int64_t i = 0; i < k.numel(); ++i) k.set(i, 0.5 * static_cast<double>(i % 3));
    for (std::int64_t j = 0; j < lk; ++j)
      for (std::int64_t c = 0; c < dv; ++c)
        v.set(j * dv + c, columns[c].sign * (1.0 + columns[c].ulps[j] * ulp));
    out.poison();
    const fmha::Status s = fmha::run(fmha::AttentionForwardParams{
        .q = q.view(), .k = k.view(), .v = v.view(), .out = out.view(), .lse = {}, .options = {}});
    ASSERT_TRUE(s.ok()) << s.message();
    for (std::int64_t c = 0; c < dv; ++c) {
      EXPECT_EQ(out.at(c), columns[c].sign * (1.0 + columns[c].rounded * ulp))
          << to_string(dt) << " column " << c;
    }
  }
}

TEST(Dense, HeadDims) {
  for (std::int64_t d : {1, 8, 40, 72, 80, 256})
    for (std::int64_t dv : {d, d == 1 ? std::int64_t{8} : d / 2 + 1}) {
      AttentionCase c;
      c.head_dim = d;
      c.value_dim = dv;
      c.seqlen_q = 17;
      c.seqlen_k = 23;
      check_case(c, static_cast<std::uint64_t>(d * 7 + dv));
    }
}

TEST(Dense, HeadCountsGqaMqa) {
  const std::pair<std::int64_t, std::int64_t> heads[] = {{1, 1}, {2, 1}, {2, 2}, {4, 2}, {4, 1},
                                                        {16, 16}, {16, 4}, {16, 1}};
  for (auto [h, hkv] : heads) {
    AttentionCase c;
    c.batch = 2;
    c.heads = h;
    c.kv_heads = hkv;
    c.seqlen_q = 9;
    c.seqlen_k = 13;
    c.options.causal = true;
    check_case(c, static_cast<std::uint64_t>(h * 100 + hkv));
  }
}

TEST(Dense, Layouts) {
  const Storage storages[] = {Storage::kContiguous, Storage::kPadded, Storage::kHeadsOuter,
                              Storage::kBroadcastBatch, Storage::kBroadcastHeads};
  for (Storage qs : storages)
    for (Storage kvs : storages) {
      AttentionCase c;
      c.batch = 2;
      c.heads = 4;
      c.kv_heads = 2;
      c.head_dim = 16;
      c.value_dim = 8;
      c.seqlen_q = 7;
      c.seqlen_k = 11;
      c.q_storage = qs;
      c.kv_storage = kvs;
      c.bias.given = true;
      check_case(c, static_cast<std::uint64_t>(qs) * 10 + static_cast<std::uint64_t>(kvs));
    }
}

class DenseDtype : public ::testing::TestWithParam<DType> {};

TEST_P(DenseDtype, PlainAndCausal) {
  for (bool causal : {false, true}) {
    AttentionCase c;
    c.dtype = GetParam();
    c.batch = 2;
    c.heads = 4;
    c.kv_heads = 2;
    c.head_dim = 72;
    c.value_dim = 40;
    c.seqlen_q = 33;
    c.seqlen_k = 47;
    c.options.causal = causal;
    c.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
    c.dlse = true;
    check_case(c, causal ? 11 : 12);
  }
}

TEST_P(DenseDtype, AllOptions) {
  AttentionCase c;
  c.dtype = GetParam();
  c.batch = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 40;
  c.value_dim = 24;
  c.seqlen_q = 19;
  c.seqlen_k = 24;
  c.options.scale = 0.3f;
  c.options.softcap = 5.0f;
  c.options.window_left = 6;
  c.options.window_right = 2;
  c.bias = {.given = true, .broadcast = {true, false, false, false}, .zero_stride = true};
  c.rel_hk = 4;
  c.sinks = true;
  c.extra = 3;
  c.dlse = true;
  c.q_storage = Storage::kHeadsOuter;
  c.kv_storage = Storage::kPadded;
  check_case(c, 21);
}

TEST_P(DenseDtype, LongHeadDim) {
  AttentionCase c;
  c.dtype = GetParam();
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 256;
  c.value_dim = 256;
  c.seqlen_q = 40;
  c.seqlen_k = 113;
  c.options.causal = true;
  check_case(c, 31);
}

TEST_P(DenseDtype, LongSequencesAllOptions) {
  AttentionCase c;
  c.dtype = GetParam();
  c.batch = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 80;
  c.value_dim = 72;
  c.seqlen_q = 113;
  c.seqlen_k = 112;
  c.options.causal = true;
  c.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
  c.options.window_left = 30;
  c.options.softcap = 8.0f;
  c.bias = {.given = true, .broadcast = {true, false, false, false}, .zero_stride = false};
  c.rel_hk = 8;  // a 8 x 14 key grid
  c.sinks = true;
  c.extra = 4;
  c.dlse = true;
  c.q_storage = Storage::kPadded;
  c.kv_storage = Storage::kHeadsOuter;
  check_case(c, 41);
}

// fp64 problems accept lse / dlse / sinks / dsinks in fp32 as well as fp64.
TEST(Dense, Float64WithFloat32Statistics) {
  AttentionCase c;
  c.dtype = DType::kFloat64;
  c.fp32_stats = true;
  c.heads = 4;
  c.kv_heads = 2;
  c.seqlen_q = 17;
  c.seqlen_k = 23;
  c.options.causal = true;
  c.sinks = true;
  c.dlse = true;
  check_case(c, 51);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DenseDtype,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64),
                         [](const auto& info) { return dtype_name(info.param); });

}  // namespace
}  // namespace fmha_test
