// The sm90 product helpers of src/cuda/sm90/tiles.cuh on one warpgroup, against a float64 product
// of the same bf16 operands (tests/cuda/sm90/wgmma_products.cu): the operand forms the
// warp-specialized D 256 backward uses (K-major from a row offset, MN-major A with MN-major or
// K-major B, an accumulating product) and stmatrix into a column offset. Needs an sm90 GPU and a
// build with sm_90a; skipped otherwise.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#if FMHA_TEST_SM90
#include "cuda/sm90/wgmma_products.h"
#endif

namespace fmha_cuda_test {
namespace {

#if FMHA_TEST_SM90
using sm90::ProductForm;

std::uint16_t to_bf16(float x) {  // round to nearest even (finite inputs)
  std::uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}
double from_bf16(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

std::vector<std::uint16_t> random_bf16(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = to_bf16(normal(rng));
  return v;
}

bool sm90_device() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major == 9;
}

// Runs `form` into *c and checks it against `expected` within tolerance x (1 + |expected|): layout
// mistakes are O(1), the fp32 sums of 16-256 products (the tensor cores truncate as they add) far
// below 1e-4.
void check(ProductForm form, const std::vector<double>& expected, int cols,
           const std::vector<std::uint16_t>& a, const std::vector<std::uint16_t>& b,
           double tolerance, std::vector<float>* c) {
  std::string error;
  ASSERT_TRUE(sm90::run_product(form, a, b, c, &error)) << error;
  ASSERT_EQ(c->size(), expected.size());
  for (std::size_t i = 0; i < c->size(); ++i) {
    ASSERT_NEAR((*c)[i], expected[i], tolerance * (1.0 + std::fabs(expected[i])))
        << "row " << i / cols << " column " << i % cols;
  }
}

TEST(CudaWgmmaProducts, OperandFormsOfTheD256Backward) {
  if (!sm90_device()) GTEST_SKIP() << "needs an sm90 GPU";
  std::mt19937_64 rng(11);
  const std::vector<std::uint16_t> a = random_bf16(64 * 256, rng);
  const std::vector<std::uint16_t> wide = random_bf16(64 * 256, rng);
  const std::vector<std::uint16_t> square = random_bf16(64 * 64, rng);
  auto A = [&](int r, int c) { return from_bf16(a[r * 256 + c]); };

  std::vector<double> rows32(64 * 32, 0.0);  // A B[32..63]^T
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 32; ++n)
      for (int k = 0; k < 256; ++k)
        rows32[m * 32 + n] += A(m, k) * from_bf16(wide[(32 + n) * 256 + k]);
  std::vector<float> c;
  check(ProductForm::kKMajorFromRow32, rows32, 32, a, wide, 1e-4, &c);
  if (::testing::Test::HasFatalFailure()) return;

  std::vector<double> stored(c.size());  // that result, rounded to bf16 by the store: exactly
  for (std::size_t i = 0; i < stored.size(); ++i) stored[i] = from_bf16(to_bf16(c[i]));
  check(ProductForm::kStoredFragments, stored, 32, a, wide, 0.0, &c);

  std::vector<double> mn(64 * 64, 0.0);  // 2 (A[:, 128..191])^T B
  std::vector<double> mk(64 * 64, 0.0);  // (A[:, 192..255])^T B^T
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 64; ++n)
      for (int k = 0; k < 64; ++k) {
        mn[m * 64 + n] += 2.0 * A(k, 128 + m) * from_bf16(square[k * 64 + n]);
        mk[m * 64 + n] += A(k, 192 + m) * from_bf16(square[n * 64 + k]);
      }
  check(ProductForm::kMnMajorAccumulate, mn, 64, a, square, 1e-4, &c);
  check(ProductForm::kMnAByKMajorB, mk, 64, a, square, 1e-4, &c);
}
#else
TEST(CudaWgmmaProducts, OperandFormsOfTheD256Backward) {
  GTEST_SKIP() << "this build has no sm_90a code";
}
#endif

}  // namespace
}  // namespace fmha_cuda_test
