// Every score modifier and mask of SPEC §2-§5, §7, §9-§11 on dense attention, against the naive
// oracle, plus the exact guarantees for fully masked rows.
#include <cmath>

#include "test_case.h"

namespace fmha_test {
namespace {

AttentionCase base_case() {
  AttentionCase c;
  c.batch = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.value_dim = 12;
  c.seqlen_q = 13;
  c.seqlen_k = 17;
  return c;
}

TEST(Options, Scale) {
  for (float scale : {0.0f, 0.05f, 1.0f, 2.5f}) {
    AttentionCase c = base_case();
    c.options.scale = scale;
    check_case(c, 3);
  }
}

TEST(Options, Softcap) {
  for (float softcap : {0.5f, 3.0f, 30.0f}) {
    AttentionCase c = base_case();
    c.options.scale = 1.0f;  // large scores so that the cap bends them
    c.options.softcap = softcap;
    c.bias.given = true;     // bias is added after the cap
    check_case(c, 4);
  }
}

TEST(Options, BiasBroadcasts) {
  const std::array<bool, 4> patterns[] = {
      {false, false, false, false}, {true, false, true, false}, {false, true, false, false},
      {true, false, false, false},  {true, true, true, false},  {true, true, false, true},
      {true, true, true, true}};
  for (const auto& broadcast : patterns)
    for (bool zero_stride : {false, true}) {
      AttentionCase c = base_case();
      c.bias = {.given = true, .broadcast = broadcast, .zero_stride = zero_stride};
      // Summed over a whole row, dS is exactly dlse * (1 - P_sink): without dlse a bias broadcast
      // over Lk would have a zero gradient, and the check would compare rounding noise.
      c.dlse = true;
      check_case(c, 5);
    }
}

// A bias (and its gradient) with no element: Lq = 0 or Lk = 0, with and without broadcasting.
TEST(Options, EmptyBias) {
  for (auto [lq, lk] : {std::pair<std::int64_t, std::int64_t>{0, 6}, {6, 0}})
    for (bool broadcast : {false, true}) {
      AttentionCase c = base_case();
      c.seqlen_q = lq;
      c.seqlen_k = lk;
      c.bias = {.given = true, .broadcast = {broadcast, false, broadcast, broadcast}, .zero_stride = true};
      c.sinks = true;
      check_case(c, 20);
    }
}

TEST(Options, BiasWithGqaAndLayouts) {
  AttentionCase c = base_case();
  c.heads = 6;
  c.kv_heads = 3;
  c.q_storage = Storage::kHeadsOuter;
  c.kv_storage = Storage::kBroadcastBatch;
  c.bias = {.given = true, .broadcast = {true, false, true, false}, .zero_stride = true};
  check_case(c, 6);
}

TEST(Options, RelativePosition) {
  for (std::int64_t hk : {1, 3, 5, 15}) {
    AttentionCase c = base_case();
    c.seqlen_k = 15;
    c.rel_hk = hk;
    c.dlse = true;  // with Hk = 1 or Wk = 1 a rel-pos gradient sums a whole row of dS (see above)
    check_case(c, 7);
    c.bias.given = true;  // both additive terms together
    c.options.softcap = 2.0f;
    check_case(c, 8);
  }
}

TEST(Options, RelativePositionBroadcasts) {
  const std::array<bool, 3> patterns[] = {{true, false, false}, {false, true, false}, {true, false, true},
                                          {true, true, true}};
  for (const auto& broadcast : patterns)
    for (bool zero_stride : {false, true}) {
      AttentionCase c = base_case();
      c.seqlen_k = 15;
      c.rel_hk = 3;
      c.rel_broadcast = broadcast;
      c.rel_zero_stride = zero_stride;
      c.options.causal = true;
      check_case(c, 21);
    }
}

TEST(Options, CausalBothAlignments) {
  for (auto align : {fmha::CausalAlignment::kTopLeft, fmha::CausalAlignment::kBottomRight})
    for (auto [lq, lk] : {std::pair<std::int64_t, std::int64_t>{13, 17}, {17, 13}, {16, 16}, {1, 9}, {9, 1}}) {
      AttentionCase c = base_case();
      c.seqlen_q = lq;
      c.seqlen_k = lk;
      c.options.causal = true;
      c.options.causal_alignment = align;
      c.dlse = true;
      check_case(c, 9);
    }
}

TEST(Options, Windows) {
  const std::pair<std::int64_t, std::int64_t> windows[] = {{0, 0}, {3, 0}, {0, 3}, {2, 5}, {5, 2}, {-1, 2},
                                                          {4, -1}, {0, -1}, {100, 100}};
  for (auto [left, right] : windows)
    for (auto align : {fmha::CausalAlignment::kTopLeft, fmha::CausalAlignment::kBottomRight})
      for (bool causal : {false, true}) {
        AttentionCase c = base_case();
        c.seqlen_q = 11;
        c.seqlen_k = 19;
        c.options.window_left = left;
        c.options.window_right = right;
        c.options.causal = causal;
        c.options.causal_alignment = align;
        check_case(c, 10);
      }
}

TEST(Options, Sinks) {
  AttentionCase c = base_case();
  c.sinks = true;
  check_case(c, 11);
  c.options.causal = true;
  c.dlse = true;
  check_case(c, 12);
}

TEST(Options, ExtraKeys) {
  for (std::int64_t r : {1, 4}) {
    AttentionCase c = base_case();
    c.extra = r;
    check_case(c, 13);
    // Extra keys ignore masks and bias but take the softcap.
    c.options.causal = true;
    c.options.window_left = 2;
    c.options.softcap = 1.5f;
    c.bias.given = true;
    c.sinks = true;
    check_case(c, 14);
  }
}

TEST(Options, ExtraKeysWithEmptySequence) {
  AttentionCase c = base_case();
  c.seqlen_k = 0;
  c.extra = 3;
  check_case(c, 15);
}

TEST(Options, LseAndDlse) {
  AttentionCase c = base_case();
  c.dlse = true;
  c.bias.given = true;
  c.options.causal = true;
  check_case(c, 16);
}

// Rows with no visible key: out exactly 0, lse -inf, every gradient exactly 0, no NaN anywhere.
TEST(Options, FullyMaskedRows) {
  AttentionCase c = base_case();
  c.seqlen_q = 9;
  c.seqlen_k = 4;
  c.options.causal = true;  // bottom-right with Lq > Lk: the first 5 rows see nothing
  c.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
  c.bias.given = true;
  c.rel_hk = 2;
  c.dlse = true;
  check_case(c, 17);

  CaseTensors t = make_tensors(c, 17);
  ASSERT_TRUE(run_forward(c, t).ok());
  ASSERT_TRUE(run_backward(c, t).ok());
  const std::int64_t masked_rows = c.seqlen_q - c.seqlen_k;
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t i = 0; i < masked_rows; ++i)
      for (std::int64_t h = 0; h < c.heads; ++h) {
        const double lse = t.lse.at((b * c.heads + h) * c.seqlen_q + i);
        EXPECT_TRUE(std::isinf(lse) && lse < 0) << "lse at b=" << b << " h=" << h << " i=" << i << ": " << lse;
        for (std::int64_t e = 0; e < c.value_dim; ++e)
          EXPECT_EQ(t.out.at(((b * c.seqlen_q + i) * c.heads + h) * c.value_dim + e), 0.0);
        for (std::int64_t e = 0; e < c.head_dim; ++e)
          EXPECT_EQ(t.dq.at(((b * c.seqlen_q + i) * c.heads + h) * c.head_dim + e), 0.0);
        for (std::int64_t j = 0; j < c.seqlen_k; ++j)
          EXPECT_EQ(t.dbias.at(((b * c.heads + h) * c.seqlen_q + i) * c.seqlen_k + j), 0.0);
        EXPECT_EQ(t.drel_h.at(((b * c.heads + h) * c.seqlen_q + i) * 2), 0.0);
      }
  for (const HostTensor* g : {&t.out, &t.dq, &t.dk, &t.dv, &t.dbias, &t.drel_h, &t.drel_w})
    for (double x : g->to_double()) ASSERT_FALSE(std::isnan(x));
}

TEST(Options, EverythingMasked) {
  AttentionCase c = base_case();
  c.options.window_left = 0;
  c.options.window_right = 0;
  c.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
  c.seqlen_q = 5;
  c.seqlen_k = 2;  // window (0, 0) bottom-right: rows 0..2 see nothing, rows 3..4 one key each
  c.sinks = true;  // a sink keeps every row's normaliser positive
  check_case(c, 18);
  c.sinks = false;
  c.dlse = true;
  check_case(c, 19);
}

}  // namespace
}  // namespace fmha_test
