// The test utilities themselves: strided layouts, rounding, poisoning and the error checks.
#include <cmath>
#include <limits>

#include "test_util.h"

namespace fmha_test {
namespace {

TEST(HostTensor, LayoutStrides) {
  const HostTensor padded(DType::kFloat32, {2, 3, 4}, {.order = {}, .pad = 3, .broadcast = {}});
  EXPECT_EQ(padded.stride(), (std::vector<std::int64_t>{21, 7, 1}));
  const HostTensor heads_outer(DType::kFloat32, {2, 5, 3, 4}, {.order = {0, 2, 1, 3}, .pad = 0, .broadcast = {}});
  EXPECT_EQ(heads_outer.stride(), (std::vector<std::int64_t>{60, 4, 20, 1}));
  const HostTensor broadcast(DType::kFloat32, {2, 5, 3, 4},
                             {.order = {}, .pad = 0, .broadcast = {true, false, true, false}});
  EXPECT_EQ(broadcast.stride(), (std::vector<std::int64_t>{0, 4, 0, 1}));
}

TEST(HostTensor, SetRoundsAndBroadcastAliases) {
  HostTensor t(DType::kBFloat16, {2, 3}, {.order = {}, .pad = 0, .broadcast = {true, false}});
  t.set(4, 1.0 + 1.0 / 1024);  // logical [1, 1]; bf16 keeps 8 bits of mantissa
  EXPECT_EQ(t.at(1), 1.0);       // [0, 1] aliases [1, 1]
  EXPECT_EQ(round_to(DType::kFloat16, 1.0 + 1.0 / 4096), 1.0);
  EXPECT_EQ(round_to(DType::kFloat16, 1.0 + 1.0 / 1024), 1.0 + 1.0 / 1024);
}

TEST(HostTensor, PoisonAndPadding) {
  HostTensor t(DType::kFloat16, {2, 3}, {.order = {}, .pad = 2, .broadcast = {}});
  t.poison();
  EXPECT_TRUE(std::isnan(t.at(5)));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, 1.0);
  EXPECT_TRUE(t.padding_untouched());
  // Write one element past the end of row 0 through a wider view of the same memory.
  fmha::TensorView v = t.view();
  static_cast<std::uint16_t*>(v.data)[3] = 0;
  EXPECT_FALSE(t.padding_untouched());
}

TEST(Compare, RelativeErrorAndFailures) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_NEAR(compare({1.0, 2.0}, {1.0, 2.0 + 1e-3}, 1).rel_error, 1e-3 / std::sqrt(1 + 4.004001), 1e-9);
  EXPECT_TRUE(compare({-inf, 1.0}, {-inf, 1.0}, 0).problem.empty());
  EXPECT_FALSE(compare({0.0, 1.0}, {-inf, 1.0}, 0).problem.empty());  // a masked row must be -inf
  EXPECT_FALSE(compare({std::nan(""), 1.0}, {0.0, 1.0}, 1).problem.empty());
  EXPECT_FALSE(close("x", {1.0, 3.0}, {1.0, 2.0}, {2}, 1e-3));
  EXPECT_TRUE(close("x", {1.0, 2.0}, {1.0, 2.0}, {2}, 0));
}

}  // namespace
}  // namespace fmha_test
