// Neighborhood attention 1-D / 2-D / 3-D (SPEC §6) against the naive oracle, whose mask is written
// from the formula; and the identities NA(kernel = grid) == dense attention.
#include "test_case.h"

namespace fmha_test {
namespace {

AttentionCase na_case(int dims, std::array<std::int64_t, 3> grid, std::array<std::int64_t, 3> kernel,
                      std::array<std::int64_t, 3> dilation, std::array<bool, 3> causal = {false, false, false}) {
  AttentionCase c;
  c.kind = Kind::kNeighborhood;
  c.batch = 2;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 8;
  c.value_dim = 6;
  c.grid = grid;
  c.neighborhood = {.num_dims = dims, .kernel_size = kernel, .dilation = dilation, .causal = causal};
  return c;
}

TEST(Neighborhood, OneDim) {
  // Odd and even kernels, dilation that does not divide the length, causal.
  check_case(na_case(1, {13, 1, 1}, {3, 1, 1}, {1, 1, 1}), 1);
  check_case(na_case(1, {13, 1, 1}, {4, 1, 1}, {1, 1, 1}), 2);
  check_case(na_case(1, {13, 1, 1}, {3, 1, 1}, {3, 1, 1}), 3);
  check_case(na_case(1, {14, 1, 1}, {2, 1, 1}, {4, 1, 1}), 4);
  check_case(na_case(1, {13, 1, 1}, {5, 1, 1}, {2, 1, 1}, {true, false, false}), 5);
  check_case(na_case(1, {13, 1, 1}, {1, 1, 1}, {1, 1, 1}), 6);
}

TEST(Neighborhood, TwoDim) {
  check_case(na_case(2, {7, 9, 1}, {3, 5, 1}, {1, 1, 1}), 11);
  check_case(na_case(2, {7, 9, 1}, {2, 4, 1}, {2, 2, 1}), 12);
  check_case(na_case(2, {8, 7, 1}, {3, 2, 1}, {2, 3, 1}, {true, false, false}), 13);
  check_case(na_case(2, {8, 7, 1}, {3, 3, 1}, {1, 2, 1}, {false, true, false}), 14);
  check_case(na_case(2, {5, 6, 1}, {2, 3, 1}, {2, 1, 1}, {true, true, false}), 15);
}

TEST(Neighborhood, ThreeDim) {
  check_case(na_case(3, {4, 5, 6}, {3, 2, 3}, {1, 2, 2}), 21);
  check_case(na_case(3, {5, 4, 5}, {2, 3, 2}, {2, 1, 2}, {true, false, true}), 22);
  check_case(na_case(3, {3, 4, 5}, {3, 4, 5}, {1, 1, 1}, {false, false, true}), 23);
}

TEST(Neighborhood, ExtraKeysSinksBiasRelPos) {
  AttentionCase c = na_case(2, {6, 5, 1}, {3, 2, 1}, {2, 2, 1}, {false, true, false});
  c.extra = 3;
  c.sinks = true;
  c.dlse = true;
  check_case(c, 31);
  c.bias.given = true;
  c.rel_hk = 6;  // the key grid itself: Hk = X1, Wk = X2
  c.options.softcap = 3.0f;
  c.options.scale = 0.5f;
  check_case(c, 32);
  c.bias = {.given = true, .broadcast = {true, false, true, false}, .zero_stride = true};
  check_case(c, 33);
}

TEST(Neighborhood, GqaAndLayouts) {
  for (Storage s : {Storage::kPadded, Storage::kHeadsOuter, Storage::kBroadcastBatch}) {
    AttentionCase c = na_case(2, {5, 7, 1}, {3, 3, 1}, {1, 2, 1});
    c.heads = 4;
    c.kv_heads = 2;
    c.q_storage = s;
    c.kv_storage = s;
    check_case(c, 41);
  }
}

class NeighborhoodDtype : public ::testing::TestWithParam<DType> {};

TEST_P(NeighborhoodDtype, TwoDim) {
  AttentionCase c = na_case(2, {9, 8, 1}, {5, 3, 1}, {1, 2, 1}, {false, true, false});
  c.dtype = GetParam();
  c.head_dim = 40;
  c.value_dim = 40;
  c.extra = 2;
  c.dlse = true;
  check_case(c, 51);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NeighborhoodDtype,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64),
                         [](const auto& info) { return dtype_name(info.param); });

// Runs NA and dense attention on the same buffers (an NA grid tensor is a dense [B, N, H, D] tensor
// in memory) and requires the same results up to rounding.
void expect_equals_dense(AttentionCase na, bool causal_dense, std::uint64_t seed) {
  SCOPED_TRACE(na.describe());
  na.extra = 2;
  na.sinks = true;
  CaseTensors t = make_tensors(na, seed);
  ASSERT_TRUE(run_forward(na, t).ok());
  ASSERT_TRUE(run_backward(na, t).ok());

  AttentionCase dense = na;
  dense.kind = Kind::kDense;
  dense.seqlen_q = dense.seqlen_k = na.rows_per_batch_q();
  dense.options.causal = causal_dense;
  CaseTensors d = make_tensors(dense, seed);
  ASSERT_EQ(d.q.to_double(), t.q.to_double());
  ASSERT_TRUE(run_forward(dense, d).ok());
  ASSERT_TRUE(run_backward(dense, d).ok());
  const double tol = 1e-6;  // fp32: the same sums in a possibly different order
  EXPECT_TRUE(close("out", t.out.to_double(), d.out.to_double(), d.out.shape(), tol));
  EXPECT_TRUE(close("lse", t.lse.to_double(), d.lse.to_double(), d.lse.shape(), tol));
  EXPECT_TRUE(close("dq", t.dq.to_double(), d.dq.to_double(), d.dq.shape(), tol));
  EXPECT_TRUE(close("dk", t.dk.to_double(), d.dk.to_double(), d.dk.shape(), tol));
  EXPECT_TRUE(close("dv", t.dv.to_double(), d.dv.to_double(), d.dv.shape(), tol));
  EXPECT_TRUE(close("dsinks", t.dsinks.to_double(), d.dsinks.to_double(), d.dsinks.shape(), tol));
  EXPECT_TRUE(close("dextra_k", t.dextra_k.to_double(), d.dextra_k.to_double(), d.dextra_k.shape(), tol));
}

TEST(Neighborhood, KernelEqualToGridIsDense) {
  expect_equals_dense(na_case(1, {11, 1, 1}, {11, 1, 1}, {1, 1, 1}), false, 61);
  expect_equals_dense(na_case(2, {4, 6, 1}, {4, 6, 1}, {1, 1, 1}), false, 62);
  expect_equals_dense(na_case(3, {3, 2, 4}, {3, 2, 4}, {1, 1, 1}), false, 63);
  // Causal on the only axis with the full kernel is top-left causal dense attention.
  expect_equals_dense(na_case(1, {10, 1, 1}, {10, 1, 1}, {1, 1, 1}, {true, false, false}), true, 64);
}

}  // namespace
}  // namespace fmha_test
