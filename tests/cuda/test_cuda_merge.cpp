// Merging partial attentions on CUDA (SPEC §12), forward and backward, against the CPU reference:
// fmha::run on float64 copies of the same inputs. Parts with an lse of -inf have NaN in their out
// rows (a kernel that reads them fails), some rows have every part at -inf (out 0, lse -inf, zero
// gradients), outputs are poisoned with NaN, and strided views pad and permute every tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/cuda_device_copy.h"
#include "cuda/cuda_forward_case.h"
#include "test_util.h"

namespace fmha_cuda_test {
namespace {

using fmha_test::HostTensor;

#define SKIP_WITHOUT_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present"

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct MergeCase {
  DType dtype = DType::kFloat16;
  std::int64_t batch = 2, rows = 17, heads = 3, value_dim = 40;
  int parts = 3;
  bool strided = false;      // permuted / padded layouts for every tensor
  bool dlse = true;          // the backward gets a gradient for the merged lse
  bool all_neg_inf = false;  // every part of every row is -inf

  std::string describe() const {
    std::ostringstream s;
    s << fmha::to_string(dtype) << " B" << batch << " Lq" << rows << " H" << heads << " Dv"
      << value_dim << " parts" << parts << (strided ? " strided" : "") << (dlse ? " dlse" : "")
      << (all_neg_inf ? " all-neg-inf" : "");
    return s.str();
  }
  std::vector<std::int64_t> out_shape() const { return {batch, rows, heads, value_dim}; }
  std::vector<std::int64_t> lse_shape() const { return {batch, heads, rows}; }
};

// Layouts of the strided variant: outs stored heads-outer ([B, H, Lq, Dv]) with padded rows, lse
// rows padded; the written tensors padded so that a write outside the view shows.
fmha_test::Layout out_layout(const MergeCase& c, int variant) {
  fmha_test::Layout l;
  if (!c.strided) return l;
  if (variant % 2 == 0) l.order = {0, 2, 1, 3};
  l.pad = 3 + variant % 3;
  return l;
}
fmha_test::Layout lse_layout(const MergeCase& c, int variant) {
  fmha_test::Layout l;
  if (c.strided) l.pad = 1 + variant % 4;
  return l;
}

struct MergeTensors {
  std::vector<HostTensor> outs, lses, douts, dlses;
  HostTensor out, lse, dout, dlse;
};

// Part n of lse row e (row-major over [B, H, Lq]) is -inf on a pattern that mixes finite and -inf
// parts and makes every fifth row entirely -inf; out rows of -inf parts are NaN.
MergeTensors make_inputs(const MergeCase& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  MergeTensors t;
  const std::int64_t lse_rows = c.batch * c.heads * c.rows;
  for (int n = 0; n < c.parts; ++n) {
    t.outs.emplace_back(c.dtype, c.out_shape(), out_layout(c, n));
    t.lses.emplace_back(DType::kFloat32, c.lse_shape(), lse_layout(c, n));
    t.outs.back().fill_uniform(rng, -1, 1);
    t.lses.back().fill_uniform(rng, -3, 3);
    for (std::int64_t e = 0; e < lse_rows; ++e) {
      const bool neg_inf = c.all_neg_inf || e % 5 == 2 || (c.parts > 1 && (e + n) % 3 == 0);
      if (!neg_inf) continue;
      t.lses.back().set(e, kNegInf);
      const std::int64_t b = e / (c.heads * c.rows), h = e / c.rows % c.heads, i = e % c.rows;
      const std::int64_t row = ((b * c.rows + i) * c.heads + h) * c.value_dim;
      for (std::int64_t d = 0; d < c.value_dim; ++d) {
        t.outs.back().set(row + d, std::numeric_limits<double>::quiet_NaN());
      }
    }
  }
  t.dout = HostTensor(c.dtype, c.out_shape(), out_layout(c, 1));
  t.dout.fill_uniform(rng, -1, 1);
  if (c.dlse) {
    t.dlse = HostTensor(DType::kFloat32, c.lse_shape(), lse_layout(c, 2));
    t.dlse.fill_uniform(rng, -1, 1);
  }
  return t;
}

HostTensor float64_copy(const HostTensor& h) {
  if (!h.defined()) return {};
  HostTensor r(DType::kFloat64, h.shape());
  r.from_double(h.to_double());
  return r;
}

std::vector<fmha::TensorView> views(std::vector<HostTensor>& ts) {
  std::vector<fmha::TensorView> v;
  for (HostTensor& t : ts) v.push_back(t.view());
  return v;
}

// The CPU reference on float64 copies: the merged out / lse, then the part gradients.
MergeTensors reference(const MergeCase& c, const MergeTensors& in) {
  MergeTensors r;
  for (int n = 0; n < c.parts; ++n) {
    r.outs.push_back(float64_copy(in.outs[static_cast<std::size_t>(n)]));
    r.lses.push_back(float64_copy(in.lses[static_cast<std::size_t>(n)]));
    r.douts.emplace_back(DType::kFloat64, c.out_shape());
    r.dlses.emplace_back(DType::kFloat64, c.lse_shape());
  }
  r.out = HostTensor(DType::kFloat64, c.out_shape());
  r.lse = HostTensor(DType::kFloat64, c.lse_shape());
  r.dout = float64_copy(in.dout);
  r.dlse = float64_copy(in.dlse);
  const fmha::Status f = fmha::run(fmha::MergeForwardParams{
      .outs = views(r.outs), .lses = views(r.lses), .out = r.out.view(), .lse = r.lse.view()});
  EXPECT_TRUE(f.ok()) << "CPU merge forward refused: " << f.message();
  const fmha::Status b = fmha::run(fmha::MergeBackwardParams{.outs = views(r.outs),
                                                             .lses = views(r.lses),
                                                             .out = r.out.view(),
                                                             .lse = r.lse.view(),
                                                             .dout = r.dout.view(),
                                                             .dlse = r.dlse.view(),
                                                             .douts = views(r.douts),
                                                             .dlses = views(r.dlses)});
  EXPECT_TRUE(b.ok()) << "CPU merge backward refused: " << b.message();
  return r;
}

// SPEC §13 for a merge: fp32 1e-5; fp16 / bf16 1e-4 plus the error of storing the exact result in
// the output's dtype (a merge has no naive same-dtype product to compare with beyond that).
void expect_close(const char* name, const MergeCase& c, const HostTensor& got,
                  const HostTensor& ref) {
  const std::vector<double> r = ref.to_double();
  const double tol = fmha_test::tolerance(c.dtype, r, r, got.dtype());
  EXPECT_TRUE(fmha_test::close(name, got.to_double(), r, got.shape(), tol));
  EXPECT_TRUE(got.padding_untouched()) << name << ": an element outside the view was written";
}

void check_merge(const MergeCase& c, std::uint64_t seed) {
  SCOPED_TRACE("case: " + c.describe() + " seed=" + std::to_string(seed));
  MergeTensors t = make_inputs(c, seed);
  const MergeTensors ref = reference(c, t);

  t.out = HostTensor(c.dtype, c.out_shape(), out_layout(c, 3));
  t.lse = HostTensor(DType::kFloat32, c.lse_shape(), lse_layout(c, 3));
  t.out.poison();
  t.lse.poison();
  for (int n = 0; n < c.parts; ++n) {
    t.douts.emplace_back(c.dtype, c.out_shape(), out_layout(c, n + 1));
    t.dlses.emplace_back(DType::kFloat32, c.lse_shape(), lse_layout(c, n + 1));
    t.douts.back().poison();
    t.dlses.back().poison();
  }

  DeviceCopies dev;
  std::vector<fmha::TensorView> outs, lses, douts, dlses;
  for (int n = 0; n < c.parts; ++n) {
    const auto i = static_cast<std::size_t>(n);
    outs.push_back(dev.upload(t.outs[i]));
    lses.push_back(dev.upload(t.lses[i]));
    douts.push_back(dev.upload(t.douts[i]));
    dlses.push_back(dev.upload(t.dlses[i]));
  }
  const fmha::TensorView out = dev.upload(t.out), lse = dev.upload(t.lse);
  const fmha::TensorView dout = dev.upload(t.dout), dlse = dev.upload(t.dlse);
  if (::testing::Test::HasFailure()) return;

  TestStream stream;
  const fmha::Status f = fmha::run(
      fmha::MergeForwardParams{.outs = outs, .lses = lses, .out = out, .lse = lse}, stream.get());
  ASSERT_TRUE(f.ok()) << "CUDA merge forward refused: " << f.message();
  const fmha::Status b = fmha::run(fmha::MergeBackwardParams{.outs = outs,
                                                             .lses = lses,
                                                             .out = out,
                                                             .lse = lse,
                                                             .dout = dout,
                                                             .dlse = dlse,
                                                             .douts = douts,
                                                             .dlses = dlses},
                                   stream.get());
  ASSERT_TRUE(b.ok()) << "CUDA merge backward refused: " << b.message();
  const cudaError_t e = stream.sync();
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);

  DeviceCopies::download(t.out, out);
  DeviceCopies::download(t.lse, lse);
  expect_close("out", c, t.out, ref.out);
  expect_close("lse", c, t.lse, ref.lse);
  for (int n = 0; n < c.parts; ++n) {
    const auto i = static_cast<std::size_t>(n);
    DeviceCopies::download(t.douts[i], douts[i]);
    DeviceCopies::download(t.dlses[i], dlses[i]);
    expect_close(("douts[" + std::to_string(n) + "]").c_str(), c, t.douts[i], ref.douts[i]);
    expect_close(("dlses[" + std::to_string(n) + "]").c_str(), c, t.dlses[i], ref.dlses[i]);
  }
}

TEST(CudaMergeSmall, EveryDtype) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    MergeCase c;
    c.dtype = dt;
    check_merge(c, 1);
    c.dlse = false;
    check_merge(c, 2);
  }
}

TEST(CudaMergeSmall, StridedViews) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    MergeCase c;
    c.dtype = dt;
    c.strided = true;
    c.parts = 4;
    check_merge(c, 11);
  }
}

TEST(CudaMergeSmall, OnePartAndAllNegInf) {
  SKIP_WITHOUT_GPU();
  MergeCase c;
  c.parts = 1;
  check_merge(c, 21);
  c.parts = 3;
  c.all_neg_inf = true;  // out 0, lse -inf, every gradient 0
  check_merge(c, 22);
}

TEST(CudaMerge, OddShapesAndSixteenParts) {
  SKIP_WITHOUT_GPU();
  MergeCase c;
  c.dtype = DType::kBFloat16;
  c.batch = 1;
  c.rows = 577;
  c.heads = 2;
  c.value_dim = 200;
  c.parts = 16;
  check_merge(c, 31);
  c.dtype = DType::kFloat16;
  c.rows = 1;
  c.value_dim = 1;
  c.parts = 7;
  c.strided = true;
  check_merge(c, 32);
  c.dtype = DType::kFloat32;
  c.batch = 3;
  c.rows = 239;
  c.heads = 4;
  c.value_dim = 256;
  c.parts = 2;
  check_merge(c, 33);
}

TEST(CudaMerge, EmptyRowsAndTooManyParts) {
  SKIP_WITHOUT_GPU();
  MergeCase c;
  c.rows = 0;
  check_merge(c, 41);

  // 17 parts: refused before anything is written.
  c.rows = 5;
  c.parts = 17;
  MergeTensors t = make_inputs(c, 42);
  HostTensor out(c.dtype, c.out_shape()), lse(DType::kFloat32, c.lse_shape());
  DeviceCopies dev;
  std::vector<fmha::TensorView> outs, lses;
  for (std::size_t n = 0; n < t.outs.size(); ++n) {
    outs.push_back(dev.upload(t.outs[n]));
    lses.push_back(dev.upload(t.lses[n]));
  }
  const fmha::Status s = fmha::run(fmha::MergeForwardParams{
      .outs = outs, .lses = lses, .out = dev.upload(out), .lse = dev.upload(lse)});
  EXPECT_EQ(s.code(), fmha::StatusCode::kNotSupported) << s.message();
  EXPECT_NE(s.message().find("at most 16 parts"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace fmha_cuda_test
