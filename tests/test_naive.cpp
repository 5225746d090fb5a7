// Checks of the oracle itself, independent of the library: hand-computed masks, and the naive
// backward against finite differences of the naive forward.
#include <cmath>

#include "naive/naive_masks.h"
#include "test_case.h"

namespace fmha_test {
namespace {

std::vector<std::int64_t> visible_keys(const std::vector<char>& mask, std::int64_t lk, std::int64_t i) {
  std::vector<std::int64_t> keys;
  for (std::int64_t j = 0; j < lk; ++j)
    if (mask[static_cast<std::size_t>(i * lk + j)]) keys.push_back(j);
  return keys;
}

using Keys = std::vector<std::int64_t>;

TEST(NaiveOracle, CausalAndWindowMasks) {
  // Lq = 3, Lk = 5. top-left causal: j <= i; bottom-right: j <= i + 2.
  auto m = naive::attention_mask(3, 5, true, false, -1, -1);
  EXPECT_EQ(visible_keys(m, 5, 0), (Keys{0}));
  EXPECT_EQ(visible_keys(m, 5, 2), (Keys{0, 1, 2}));
  m = naive::attention_mask(3, 5, true, true, -1, -1);
  EXPECT_EQ(visible_keys(m, 5, 0), (Keys{0, 1, 2}));
  EXPECT_EQ(visible_keys(m, 5, 2), (Keys{0, 1, 2, 3, 4}));
  // Causal is window (-1, 0).
  EXPECT_EQ(naive::attention_mask(7, 4, true, true, -1, -1), naive::attention_mask(7, 4, false, true, -1, 0));
  // Window (1, 1) bottom-right around d(i) = i + 2.
  m = naive::attention_mask(3, 5, false, true, 1, 1);
  EXPECT_EQ(visible_keys(m, 5, 0), (Keys{1, 2, 3}));
  EXPECT_EQ(visible_keys(m, 5, 2), (Keys{3, 4}));
  // Lq > Lk bottom-right: the first Lq - Lk rows see nothing.
  m = naive::attention_mask(4, 2, true, true, -1, -1);
  EXPECT_EQ(visible_keys(m, 2, 1), (Keys{}));
  EXPECT_EQ(visible_keys(m, 2, 2), (Keys{0}));
}

TEST(NaiveOracle, NeighborhoodMask1d) {
  naive::NeighborhoodGeometry g;
  g.grid = {5, 1, 1};
  g.kernel = {3, 1, 1};
  auto m = naive::neighborhood_mask(g);
  EXPECT_EQ(visible_keys(m, 5, 0), (Keys{0, 1, 2}));  // shifted inward at the border
  EXPECT_EQ(visible_keys(m, 5, 2), (Keys{1, 2, 3}));
  EXPECT_EQ(visible_keys(m, 5, 4), (Keys{2, 3, 4}));
  // X = 7, K = 2, dilation 3: groups {0, 3, 6}, {1, 4}, {2, 5}.
  g.grid = {7, 1, 1};
  g.kernel = {2, 1, 1};
  g.dilation = {3, 1, 1};
  m = naive::neighborhood_mask(g);
  EXPECT_EQ(visible_keys(m, 7, 0), (Keys{0, 3}));
  EXPECT_EQ(visible_keys(m, 7, 3), (Keys{0, 3}));  // p = 1: start = clamp(1 - 1, 0, 1) = 0
  EXPECT_EQ(visible_keys(m, 7, 6), (Keys{3, 6}));
  EXPECT_EQ(visible_keys(m, 7, 4), (Keys{1, 4}));
  // Causal: the K most recent of the query's group.
  g.grid = {5, 1, 1};
  g.kernel = {2, 1, 1};
  g.dilation = {1, 1, 1};
  g.causal = {true, false, false};
  m = naive::neighborhood_mask(g);
  EXPECT_EQ(visible_keys(m, 5, 0), (Keys{0}));
  EXPECT_EQ(visible_keys(m, 5, 3), (Keys{2, 3}));
}

TEST(NaiveOracle, NeighborhoodMask2dIsProductOfAxes) {
  naive::NeighborhoodGeometry g;
  g.rank = 2;
  g.grid = {3, 4, 1};
  g.kernel = {3, 4, 1};
  const auto all = naive::neighborhood_mask(g);
  for (char v : all) EXPECT_TRUE(v);  // kernel = grid: dense
  g.kernel = {1, 2, 1};
  const auto m = naive::neighborhood_mask(g);
  // Query (1, 3) = token 7: row 1 only, columns {2, 3}.
  EXPECT_EQ(visible_keys(m, 12, 7), (Keys{6, 7}));
}

// The naive backward against central differences of the naive forward, every input at once.
TEST(NaiveOracle, BackwardMatchesFiniteDifferences) {
  AttentionCase c;
  c.dtype = DType::kFloat64;
  c.batch = 2;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 3;
  c.value_dim = 2;
  c.seqlen_q = 4;
  c.seqlen_k = 4;
  c.options.causal = true;
  c.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
  c.options.softcap = 1.5f;
  c.bias.given = true;
  c.rel_hk = 2;
  c.sinks = true;
  c.extra = 1;
  c.dlse = true;
  const CaseTensors t = make_tensors(c, 3);
  naive::Problem p = naive_problem(c, t);
  const std::vector<double> w_out = t.dout.to_double();
  const std::vector<double> w_lse = lse_from_library(c, t.dlse.to_double());
  auto loss = [&]() {
    const naive::Forward f = naive::forward(p, naive::exact);
    double l = 0;
    for (std::size_t i = 0; i < f.out.size(); ++i) l += f.out[i] * w_out[i];
    for (std::size_t i = 0; i < f.lse.size(); ++i) l += f.lse[i] * w_lse[i];
    return l;
  };
  const naive::Gradients g = naive::backward(p, naive::forward(p, naive::exact), w_out, w_lse, naive::exact);
  const std::pair<std::vector<double>*, const std::vector<double>*> pairs[] = {
      {&p.q, &g.dq},         {&p.k, &g.dk},         {&p.v, &g.dv},         {&p.bias, &g.dbias},
      {&p.rel_h, &g.drel_h}, {&p.rel_w, &g.drel_w}, {&p.sinks, &g.dsinks}, {&p.extra_k, &g.dextra_k},
      {&p.extra_v, &g.dextra_v}};
  const double step = 1e-5;
  int index = 0;
  for (auto [input, grad] : pairs) {
    ASSERT_FALSE(input->empty());
    std::vector<double> numeric;
    for (double& x : *input) {
      const double saved = x;
      x = saved + step;
      const double up = loss();
      x = saved - step;
      const double down = loss();
      x = saved;
      numeric.push_back((up - down) / (2 * step));
    }
    EXPECT_TRUE(close("naive gradient #" + std::to_string(index++), *grad, numeric,
                      {static_cast<std::int64_t>(numeric.size())}, 1e-7));
  }
}

}  // namespace
}  // namespace fmha_test
