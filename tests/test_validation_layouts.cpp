// Validation of variable-length batches (SPEC §8), neighborhood attention (§6) and merges (§12):
// every refused input names its problem and leaves all memory untouched.
#include <vector>

#include "validation_fixtures.h"

namespace fmha_validation {
namespace {

using fmha::detail::Layout;
using fmha::detail::ProblemShape;

// ---- Varlen: 2 sequences, q rows 3 + 2, k rows 4 + 3 -------------------------------------------

// The inputs and outputs forward and backward share.
template <typename Params>
Params varlen_call(Store& s) {
  Params p;
  p.q = s.make(DType::kFloat32, {5, 4, 8});
  p.k = s.make(DType::kFloat32, {7, 2, 8});
  p.v = s.make(DType::kFloat32, {7, 2, 6});
  p.cu_seqlens_q = s.offsets({0, 3, 5});
  p.cu_seqlens_k = s.offsets({0, 4, 7});
  p.max_seqlen_q = 3;
  p.max_seqlen_k = 4;
  p.out = s.make(DType::kFloat32, {5, 4, 6});
  p.lse = s.make(DType::kFloat32, {4, 5});
  return p;
}

fmha::VarlenForwardParams varlen_forward(Store& s) {
  return varlen_call<fmha::VarlenForwardParams>(s);
}

fmha::VarlenBackwardParams varlen_backward(Store& s) {
  auto p = varlen_call<fmha::VarlenBackwardParams>(s);
  p.dout = s.make(DType::kFloat32, {5, 4, 6});
  p.grads.dq = s.make(DType::kFloat32, {5, 4, 8});
  p.grads.dk = s.make(DType::kFloat32, {7, 2, 8});
  p.grads.dv = s.make(DType::kFloat32, {7, 2, 6});
  return p;
}

TEST(ValidationVarlen, ValidCallResolvesTheProblemShape) {
  Store s;
  auto p = varlen_forward(s);
  p.options.bias = s.make(DType::kFloat32, {2, 4, 3, 4});  // [B, H, max_seqlen_q, max_seqlen_k]
  p.options.extra_k = s.make(DType::kFloat32, {2, 1, 2, 8});
  p.options.extra_v = s.make(DType::kFloat32, {2, 1, 2, 6});
  ProblemShape shape;
  const fmha::Status status = fmha::detail::validate(p, &shape);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(shape.layout, Layout::kVarlen);
  EXPECT_EQ(shape.batch, 2);
  EXPECT_EQ(shape.seqlen_q, 3);
  EXPECT_EQ(shape.seqlen_k, 4);
  EXPECT_EQ(shape.total_q, 5);
  EXPECT_EQ(shape.total_k, 7);
  EXPECT_EQ(shape.num_extra, 1);
  expect_valid(varlen_backward(s));
}

TEST(ValidationVarlen, EmptyBatchesAndSequencesAreValid) {
  Store s;
  auto p = varlen_forward(s);
  p.q = s.make(DType::kFloat32, {0, 4, 8});
  p.out = s.make(DType::kFloat32, {0, 4, 6});
  p.lse = s.make(DType::kFloat32, {4, 0});
  p.cu_seqlens_q = s.offsets({0, 0, 0});
  expect_valid(p);
  p.k = s.make(DType::kFloat32, {0, 2, 8});
  p.v = s.make(DType::kFloat32, {0, 2, 6});
  p.cu_seqlens_q = s.offsets({0});
  p.cu_seqlens_k = s.offsets({0});
  p.max_seqlen_q = p.max_seqlen_k = 0;
  expect_valid(p);
}

TEST(ValidationVarlen, BadOffsets) {
  Store s;
  auto p = varlen_forward(s);
  p.cu_seqlens_q = s.offsets({1, 3, 5});
  expect_refused(s, p, "cu_seqlens_q[0] = 1; expected 0");
  p.cu_seqlens_q = s.offsets({0, 3, 2});
  expect_refused(s, p, "cu_seqlens_q[2] = 2 is less than cu_seqlens_q[1] = 3");
  p.cu_seqlens_q = s.offsets({0, 3, 4});
  expect_refused(s, p, "cu_seqlens_q[2] = 4 but q has 5 rows; the last offset must equal");
  p = varlen_forward(s);
  p.cu_seqlens_k = s.offsets({0, 1, 7});
  expect_refused(s, p,
                 "sequence 1 has 6 rows (cu_seqlens_k[2] - cu_seqlens_k[1]) but "
                 "max_seqlen_k = 4");
}

TEST(ValidationVarlen, OffsetsTensors) {
  Store s;
  auto p = varlen_forward(s);
  p.cu_seqlens_q = s.make(DType::kFloat32, {3});
  expect_refused(s, p, "cu_seqlens_q has dtype float32; expected int32");
  p = varlen_forward(s);
  p.cu_seqlens_k = s.offsets({0, 4, 6, 7});
  expect_refused(s, p, "cu_seqlens_k has shape [4]; expected [B + 1] = [3]");
  p = varlen_forward(s);
  p.cu_seqlens_q = s.offsets({});
  expect_refused(s, p, "cu_seqlens_q has shape [0]");
  p = varlen_forward(s);
  p.cu_seqlens_k = {};
  expect_refused(s, p, "cu_seqlens_k is required but not given");
  p = varlen_forward(s);
  p.cu_seqlens_k.device = Device::cuda(0);
  expect_refused(s, p, "cu_seqlens_k is on cuda:0 but q is on cpu");
  p = varlen_forward(s);
  p.cu_seqlens_q.stride[0] = 2;
  expect_refused(s, p, "cu_seqlens_q has stride 2 on its last dimension (size 3)");
  p = varlen_forward(s);
  p.max_seqlen_k = -1;
  expect_refused(s, p, "max_seqlen_k = -1; expected a value >= 0");
}

// CUDA offsets are never read (that would synchronise the device): only their view is checked.
TEST(ValidationVarlen, CudaOffsetsAreNotRead) {
  Store s;
  auto p = varlen_forward(s);
  p.cu_seqlens_q = s.offsets({7, 1, 0});
  for (TensorView* t : {&p.q, &p.k, &p.v, &p.cu_seqlens_q, &p.cu_seqlens_k, &p.out, &p.lse}) {
    t->device = Device::cuda(0);
  }
  expect_valid(p);
}

TEST(ValidationVarlen, RanksOutsideZeroToSixAreRefused) {
  Store s;
  auto p = varlen_forward(s);
  p.cu_seqlens_k.rank = 8;
  expect_refused(s, p, "cu_seqlens_k has rank 8; expected 1..6 dimensions");
}

TEST(ValidationVarlen, LayoutSpecificShapes) {
  Store s;
  auto p = varlen_forward(s);
  p.lse = s.make(DType::kFloat32, {2, 4, 3});
  expect_refused(s, p, "lse has rank 3 (shape [2, 4, 3]); expected rank 2, [H, total_q]");
  p = varlen_forward(s);
  p.options.bias = s.make(DType::kFloat32, {2, 4, 5, 7});
  expect_refused(s, p, "expected [B, H, max_seqlen_q, max_seqlen_k] = [2, 4, 3, 4]");
  p = varlen_forward(s);
  p.options.rel_h = s.make(DType::kFloat32, {2, 4, 3, 2});
  p.options.rel_w = s.make(DType::kFloat32, {2, 4, 3, 2});
  expect_refused(s, p, "not accepted for variable-length batches");
  p = varlen_forward(s);
  p.q = s.make(DType::kFloat32, {2, 5, 4, 8});
  expect_refused(s, p, "q has rank 4 (shape [2, 5, 4, 8]); expected rank 3, [total_q, H, D]");
  p = varlen_forward(s);
  p.k = s.make(DType::kFloat32, {7, 3, 8});
  expect_refused(s, p, "k has 3 heads but q has 4");
}

TEST(ValidationVarlen, BackwardChecks) {
  Store s;
  auto p = varlen_backward(s);
  p.lse = {};
  expect_refused(s, p, "lse is required but not given");
  p = varlen_backward(s);
  p.dlse = s.make(DType::kFloat32, {2, 4, 3});
  expect_refused(s, p, "dlse has rank 3");
  p = varlen_backward(s);
  p.grads.dbias = s.make(DType::kFloat32, {2, 4, 3, 4});
  expect_refused(s, p, "grads.dbias is given but options.bias is not");
}

// ---- Neighborhood: 2-D grid 6 x 8, kernel 3 x 5
// ----------------------------------------------------

template <typename Params>
Params na_call(Store& s) {
  Params p;
  p.q = s.make(DType::kFloat32, {2, 6, 8, 4, 8});
  p.k = s.make(DType::kFloat32, {2, 6, 8, 2, 8});
  p.v = s.make(DType::kFloat32, {2, 6, 8, 2, 6});
  p.out = s.make(DType::kFloat32, {2, 6, 8, 4, 6});
  p.lse = s.make(DType::kFloat32, {2, 4, 6, 8});
  p.neighborhood.num_dims = 2;
  p.neighborhood.kernel_size = {3, 5, 1};
  p.neighborhood.dilation = {2, 1, 1};
  return p;
}

fmha::NeighborhoodForwardParams na_forward(Store& s) {
  return na_call<fmha::NeighborhoodForwardParams>(s);
}

fmha::NeighborhoodBackwardParams na_backward(Store& s) {
  auto p = na_call<fmha::NeighborhoodBackwardParams>(s);
  p.neighborhood.causal = {true, false, false};
  p.dout = s.make(DType::kFloat32, {2, 6, 8, 4, 6});
  p.grads.dq = s.make(DType::kFloat32, {2, 6, 8, 4, 8});
  p.grads.dk = s.make(DType::kFloat32, {2, 6, 8, 2, 8});
  p.grads.dv = s.make(DType::kFloat32, {2, 6, 8, 2, 6});
  return p;
}

TEST(ValidationNeighborhood, ValidCallResolvesTheGrid) {
  Store s;
  auto p = na_forward(s);
  p.options.rel_h = s.make(DType::kFloat32, {2, 4, 48, 6});  // the key grid is 6 x 8
  p.options.rel_w = s.make(DType::kFloat32, {2, 4, 48, 8});
  p.options.sinks = s.make(DType::kFloat32, {4});
  ProblemShape shape;
  const fmha::Status status = fmha::detail::validate(p, &shape);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(shape.layout, Layout::kNeighborhood);
  EXPECT_EQ(shape.grid_rank, 2);
  EXPECT_EQ(shape.grid[0], 6);
  EXPECT_EQ(shape.grid[1], 8);
  EXPECT_EQ(shape.grid[2], 1);
  EXPECT_EQ(shape.seqlen_q, 48);
  EXPECT_EQ(shape.seqlen_k, 48);
  EXPECT_EQ(shape.total_q, 96);
  EXPECT_EQ(shape.rel_h_size, 6);
  expect_valid(na_backward(s));
}

TEST(ValidationNeighborhood, OneAndThreeDimensionalGrids) {
  Store s;
  fmha::NeighborhoodForwardParams p;
  p.q = s.make(DType::kFloat16, {1, 9, 2, 16});
  p.k = p.v = s.make(DType::kFloat16, {1, 9, 1, 16});
  p.out = s.make(DType::kFloat16, {1, 9, 2, 16});
  p.neighborhood.kernel_size = {9, 0, 0};  // axes past num_dims = 1 are ignored
  expect_valid(p);
  p.q = s.make(DType::kFloat16, {1, 3, 4, 5, 2, 16});
  p.k = p.v = s.make(DType::kFloat16, {1, 3, 4, 5, 1, 16});
  p.out = s.make(DType::kFloat16, {1, 3, 4, 5, 2, 16});
  p.lse = s.make(DType::kFloat32, {1, 2, 3, 4, 5});
  p.neighborhood.num_dims = 3;
  p.neighborhood.kernel_size = {3, 2, 5};
  p.neighborhood.dilation = {1, 2, 1};
  expect_valid(p);
}

TEST(ValidationNeighborhood, KernelMustFitTheGrid) {
  Store s;
  auto p = na_forward(s);
  p.neighborhood.kernel_size = {3, 3, 1};
  p.neighborhood.dilation = {1, 3, 1};
  expect_refused(s, p, "kernel_size[1] * dilation[1] = 9 exceeds the grid size 8 on axis 1");
  p = na_forward(s);
  p.neighborhood.kernel_size[0] = 0;
  expect_refused(s, p, "kernel_size[0] = 0; expected >= 1");
  p = na_forward(s);
  p.neighborhood.dilation[1] = 0;
  expect_refused(s, p, "dilation[1] = 0; expected >= 1");
  p = na_forward(s);
  p.neighborhood.dilation[0] = std::int64_t{1} << 62;
  expect_refused(s, p, "overflows int64");
}

TEST(ValidationNeighborhood, GridAndRank) {
  Store s;
  auto p = na_forward(s);
  p.neighborhood.num_dims = 4;
  expect_refused(s, p, "neighborhood.num_dims = 4; expected 1, 2 or 3");
  p = na_forward(s);
  p.neighborhood.num_dims = 1;
  expect_refused(s, p, "q has rank 5 (shape [2, 6, 8, 4, 8]); expected rank 4, [B, X1, H, D]");
  p = na_forward(s);
  p.k = s.make(DType::kFloat32, {2, 6, 9, 2, 8});
  expect_refused(s, p, "k has grid [6, 9] but q has [6, 8]");
  p = na_forward(s);
  p.lse = s.make(DType::kFloat32, {2, 4, 48});
  expect_refused(s, p, "lse has rank 3 (shape [2, 4, 48]); expected rank 4, [B, H, X1, X2]");
  p = na_forward(s);
  p.options.bias = s.make(DType::kFloat32, {2, 4, 48, 47});
  expect_refused(s, p, "expected [B, H, X1*X2, X1*X2] = [2, 4, 48, 48]");
}

TEST(ValidationNeighborhood, ExtraKeysAndSinks) {
  Store s;
  auto p = na_forward(s);
  p.options.extra_k = s.make(DType::kFloat32, {2, 4, 2, 8});
  p.options.extra_v = s.make(DType::kFloat32, {2, 4, 2, 6});
  p.options.sinks = s.make(DType::kFloat32, {4});
  expect_valid(p);
  p.options.extra_v = s.make(DType::kFloat32, {2, 4, 2, 8});
  expect_refused(s, p, "options.extra_v has shape [2, 4, 2, 8]; expected [B, R, Hkv, Dv]");
}

TEST(ValidationNeighborhood, SequenceMasksAreRefused) {
  Store s;
  auto p = na_forward(s);
  p.options.causal = true;
  expect_refused(s, p,
                 "options.causal = true is not accepted by neighborhood attention; set "
                 "NeighborhoodOptions.causal");
  p = na_forward(s);
  p.options.window_left = 2;
  expect_refused(s, p, "options.window_left = 2 and options.window_right = -1 are not accepted");
}

TEST(ValidationNeighborhood, RanksOutsideZeroToSixAreRefused) {
  Store s;
  auto p = na_backward(s);
  p.grads.drel_h.rank = -1;
  expect_refused(s, p, "grads.drel_h has rank -1");
}

TEST(ValidationNeighborhood, BackwardChecks) {
  Store s;
  auto p = na_backward(s);
  p.grads.dq = s.make(DType::kFloat32, {2, 6, 8, 4, 6});
  expect_refused(s, p, "grads.dq has shape [2, 6, 8, 4, 6]; expected [B, X1, X2, H, D]");
  p = na_backward(s);
  p.lse = {};
  expect_refused(s, p, "lse is required but not given");
}

// ---- Merge: 3 parts of [2, 5, 4, 6]
// ---------------------------------------------------------------

fmha::MergeForwardParams merge_forward(Store& s, int parts = 3) {
  fmha::MergeForwardParams p;
  p.out = s.make(DType::kFloat16, {2, 5, 4, 6});
  p.lse = s.make(DType::kFloat32, {2, 4, 5});
  for (int i = 0; i < parts; ++i) {
    p.outs.push_back(s.make(DType::kFloat16, {2, 5, 4, 6}));
    p.lses.push_back(s.make(DType::kFloat32, {2, 4, 5}));
  }
  return p;
}

fmha::MergeBackwardParams merge_backward(Store& s, int parts = 3) {
  const auto f = merge_forward(s, parts);
  fmha::MergeBackwardParams p;
  p.outs = f.outs;
  p.lses = f.lses;
  p.out = f.out;
  p.lse = f.lse;
  p.dout = s.make(DType::kFloat16, {2, 5, 4, 6});
  for (int i = 0; i < parts; ++i) {
    p.douts.push_back(s.make(DType::kFloat16, {2, 5, 4, 6}));
    p.dlses.push_back(s.make(DType::kFloat32, {2, 4, 5}));
  }
  return p;
}

TEST(ValidationMerge, ValidCallsPass) {
  Store s;
  expect_valid(merge_forward(s, 1));
  expect_valid(merge_forward(s));
  expect_valid(merge_backward(s));
  auto p = merge_backward(s);
  p.dlse = s.make(DType::kFloat32, {2, 4, 5});
  expect_valid(p);
}

TEST(ValidationMerge, PartsMustMatchTheMergedOutput) {
  Store s;
  expect_refused(s, merge_forward(s, 0), "merge needs at least one part; got 0 outs");
  auto p = merge_forward(s);
  p.lses.pop_back();
  expect_refused(s, p, "merge got 3 outs but 2 lses; expected one lse per part");
  p = merge_forward(s);
  p.outs[1] = s.make(DType::kFloat16, {2, 6, 4, 6});
  expect_refused(s, p, "outs[1] has shape [2, 6, 4, 6]; expected [B, Lq, H, Dv] = [2, 5, 4, 6]");
  p = merge_forward(s);
  p.outs[2] = s.make(DType::kFloat32, {2, 5, 4, 6});
  expect_refused(s, p, "outs[2] has dtype float32 but out has float16");
  p = merge_forward(s);
  p.lses[0] = s.make(DType::kFloat16, {2, 4, 5});
  expect_refused(s, p, "lses[0] has dtype float16; expected float32");
  p = merge_forward(s);
  p.lses[1].device = Device::cuda(0);
  expect_refused(s, p, "lses[1] is on cuda:0 but out is on cpu");
  p = merge_forward(s);
  p.lse = {};
  expect_refused(s, p, "lse is required but not given");
  p = merge_forward(s);
  p.out = s.make_strided(DType::kFloat16, {2, 5, 4, 6}, {0, 24, 6, 1}, 120);
  expect_refused(s, p, "out has stride 0 on dimension 0 (size 2); an output cannot broadcast");
}

// Found by the fuzzing harness: ranks outside 0..6 in the parts' lists (see
// ValidationDense.RanksOutsideZeroToSixAreRefused).
TEST(ValidationMerge, RanksOutsideZeroToSixAreRefused) {
  Store s;
  auto p = merge_forward(s);
  p.outs[1].rank = 9;
  expect_refused(s, p, "outs[1] has rank 9; expected 1..6 dimensions");
  auto b = merge_backward(s);
  b.dlses[2].rank = -1;
  expect_refused(s, b, "dlses[2] has rank -1");
  b = merge_backward(s);
  b.dlse.rank = 64;
  expect_refused(s, b, "dlse has rank 64");
}

TEST(ValidationMerge, Float64IsRefusedOnCuda) {
  Store s;
  fmha::MergeForwardParams p;
  p.out = s.make(DType::kFloat64, {2, 5, 4, 6}, Device::cuda(0));
  p.lse = s.make(DType::kFloat32, {2, 4, 5}, Device::cuda(0));
  p.outs = {s.make(DType::kFloat64, {2, 5, 4, 6}, Device::cuda(0))};
  p.lses = {s.make(DType::kFloat32, {2, 4, 5}, Device::cuda(0))};
  expect_refused(s, p, "dtype float64 is only supported on CPU tensors; out is float64 on cuda:0",
                 fmha::StatusCode::kNotSupported);
}

TEST(ValidationMerge, BackwardNeedsOneGradientPerPart) {
  Store s;
  auto p = merge_backward(s);
  p.douts.pop_back();
  expect_refused(s, p, "merge backward got 2 douts for 3 parts; expected one per part");
  p = merge_backward(s);
  p.dlses[2] = s.make(DType::kFloat32, {2, 4, 6});
  expect_refused(s, p, "dlses[2] has shape [2, 4, 6]; expected [B, H, Lq] = [2, 4, 5]");
  p = merge_backward(s);
  p.dout = {};
  expect_refused(s, p, "dout is required but not given");
}

}  // namespace
}  // namespace fmha_validation
