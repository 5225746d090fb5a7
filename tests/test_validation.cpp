// Validation of dense attention (SPEC §1-§5, §7, §9, §14): every refused input names its problem
// and leaves all memory untouched; valid inputs, including empty and strided ones, pass check().
// Varlen, neighborhood and merge validation: test_validation_layouts.cpp.
#include <cmath>
#include <limits>
#include <string>

#include "validation_fixtures.h"

namespace fmha_validation {
namespace {

using fmha::StatusCode;

// ---- Valid inputs ---------------------------------------------------------------------------

TEST(ValidationDense, ForwardResolvesTheProblemShape) {
  Store s;
  const auto p = dense_forward(s);
  fmha::detail::ProblemShape shape;
  ASSERT_TRUE(fmha::detail::validate(p, &shape).ok());
  EXPECT_EQ(shape.layout, fmha::detail::Layout::kDense);
  EXPECT_EQ(shape.batch, 2);
  EXPECT_EQ(shape.seqlen_q, 5);
  EXPECT_EQ(shape.seqlen_k, 7);
  EXPECT_EQ(shape.heads, 4);
  EXPECT_EQ(shape.kv_heads, 2);
  EXPECT_EQ(shape.head_dim, 8);
  EXPECT_EQ(shape.value_dim, 6);
  EXPECT_EQ(shape.total_q, 10);
  EXPECT_EQ(shape.total_k, 14);
  EXPECT_EQ(shape.num_extra, 0);
  EXPECT_EQ(shape.grid_rank, 0);
  EXPECT_FLOAT_EQ(shape.scale, 1.0f / std::sqrt(8.0f));
}

TEST(ValidationDense, ExplicitScaleAndEveryOptionResolve) {
  Store s;
  auto p = dense_forward(s);
  p.options.scale = 0.25f;
  p.options.softcap = 30.0f;
  p.options.causal = true;
  p.options.window_left = 3;
  p.options.window_right = 0;
  p.options.bias = s.make(DType::kFloat32, {2, 4, 5, 7});
  p.options.rel_h = s.make(DType::kFloat32, {2, 4, 5, 7});  // a 7 x 1 key grid
  p.options.rel_w = s.make(DType::kFloat32, {2, 4, 5, 1});
  p.options.sinks = s.make(DType::kFloat32, {4});
  p.options.extra_k = s.make(DType::kFloat32, {2, 3, 2, 8});
  p.options.extra_v = s.make(DType::kFloat32, {2, 3, 2, 6});
  fmha::detail::ProblemShape shape;
  const fmha::Status status = fmha::detail::validate(p, &shape);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_FLOAT_EQ(shape.scale, 0.25f);
  EXPECT_EQ(shape.num_extra, 3);
  EXPECT_EQ(shape.rel_h_size, 7);
  EXPECT_EQ(shape.rel_w_size, 1);
}

TEST(ValidationDense, EmptySequencesAreValid) {
  for (const auto& [lq, lk] : {std::pair{0, 7}, std::pair{5, 0}, std::pair{0, 0}}) {
    Store s;
    auto p = dense_forward(s, {.Lq = lq, .Lk = lk});
    expect_valid(p);
    p.out.data = nullptr;  // no elements: no memory needed
    if (lq == 0) expect_valid(p);
    expect_valid(dense_backward(s, {.Lq = lq, .Lk = lk}));
  }
  Store s;
  expect_valid(dense_forward(s, {.B = 0}));
}

TEST(ValidationDense, LseIsOptionalInTheForward) {
  Store s;
  auto p = dense_forward(s);
  p.lse = {};
  expect_valid(p);
}

TEST(ValidationDense, TransposedAndBroadcastInputsPass) {
  Store s;
  auto p = dense_forward(s);
  // q stored as [B, H, Lq, D] and viewed as [B, Lq, H, D].
  p.q = s.make_strided(DType::kFloat32, {2, 5, 4, 8}, {4 * 5 * 8, 8, 5 * 8, 1}, 2 * 4 * 5 * 8);
  // k shared by the whole batch, v padded between rows.
  p.k = s.make_strided(DType::kFloat32, {2, 7, 2, 8}, {0, 16, 8, 1}, 7 * 2 * 8);
  p.v = s.make_strided(DType::kFloat32, {2, 7, 2, 6}, {7 * 2 * 10, 20, 10, 1}, 2 * 7 * 2 * 10);
  expect_valid(p);
}

TEST(ValidationDense, BroadcastBiasAndMatchingDbiasPass) {
  Store s;
  auto p = dense_backward(s);
  // [1, H, 1, Lk] expanded to [B, H, Lq, Lk].
  p.options.bias = s.make_strided(DType::kFloat32, {2, 4, 5, 7}, {0, 7, 0, 1}, 4 * 7);
  p.grads.dbias = s.make_strided(DType::kFloat32, {2, 4, 5, 7}, {0, 7, 0, 1}, 4 * 7);
  expect_valid(p);
  // A bias constant over the keys broadcasts its last dimension too.
  p.options.bias = s.make_strided(DType::kFloat32, {2, 4, 5, 7}, {20, 5, 1, 0}, 40);
  p.grads.dbias = s.make_strided(DType::kFloat32, {2, 4, 5, 7}, {20, 5, 1, 0}, 40);
  expect_valid(p);
}

TEST(ValidationDense, SizeOneBiasDimensionsBroadcast) {
  Store s;
  auto p = dense_backward(s);
  p.options.bias = s.make(DType::kFloat32, {1, 4, 1, 7});
  p.grads.dbias = s.make(DType::kFloat32, {1, 4, 1, 7});  // receives the sum over B and Lq
  expect_valid(p);
  p.options.rel_h = s.make(DType::kFloat32, {1, 1, 5, 7});
  p.options.rel_w = s.make(DType::kFloat32, {2, 4, 1, 1});
  p.grads.drel_h = s.make(DType::kFloat32, {1, 1, 5, 7});
  expect_valid(p);
  p.grads.drel_h = s.make(DType::kFloat32, {2, 4, 5, 7});
  expect_refused(s, p,
                 "grads.drel_h has shape [2, 4, 5, 7]; expected [B, H, Lq, Hk] = [1, 1, 5, 7]");
}

TEST(ValidationDense, SizeOneDimensionsMayHaveAnyStride) {
  Store s;
  auto p = dense_forward(s, {.Lq = 1, .D = 1, .Dv = 1});
  p.q = s.make_strided(DType::kFloat32, {2, 1, 4, 1}, {4, 99, 1, 7}, 8);
  p.out = s.make_strided(DType::kFloat32, {2, 1, 4, 1}, {4, 0, 1, 0}, 8);
  expect_valid(p);
}

TEST(ValidationDense, BackwardWithEveryGradientPasses) {
  Store s;
  auto p = dense_backward(s);
  p.options.bias = s.make(DType::kFloat32, {2, 4, 5, 7});
  p.options.rel_h = s.make(DType::kFloat32, {2, 4, 5, 1});  // a 1 x 7 key grid
  p.options.rel_w = s.make(DType::kFloat32, {2, 4, 5, 7});
  p.options.sinks = s.make(DType::kFloat32, {4});
  p.options.extra_k = s.make(DType::kFloat32, {2, 3, 2, 8});
  p.options.extra_v = s.make(DType::kFloat32, {2, 3, 2, 6});
  p.grads.dbias = s.make(DType::kFloat32, {2, 4, 5, 7});
  p.grads.drel_h = s.make(DType::kFloat32, {2, 4, 5, 1});
  p.grads.drel_w = s.make(DType::kFloat32, {2, 4, 5, 7});
  p.grads.dsinks = s.make(DType::kFloat32, {4});
  p.grads.dextra_k = s.make(DType::kFloat32, {2, 3, 2, 8});
  p.grads.dextra_v = s.make(DType::kFloat32, {2, 3, 2, 6});
  expect_valid(p);
  p.dlse = {};
  expect_valid(p);
}

TEST(ValidationDense, HalfPrecisionAndFloat64OnCpuPass) {
  Store s;
  expect_valid(dense_forward(s, {.dtype = DType::kFloat16}));
  expect_valid(dense_backward(s, {.dtype = DType::kBFloat16}));
  // float64 problems take float32 or float64 statistics (finite differences need the latter).
  expect_valid(dense_backward(s, {.dtype = DType::kFloat64}));
  expect_valid(dense_backward(s, {.dtype = DType::kFloat64, .stat = DType::kFloat64}));
}

// ---- Presence, rank, dtype, device ----------------------------------------------------------

TEST(ValidationDense, MissingTensorsAreNamed) {
  Store s;
  auto p = dense_forward(s);
  p.k = {};
  expect_refused(s, p, "k is required but not given");
  p = dense_forward(s);
  p.out = {};
  expect_refused(s, p, "out is required but not given");
}

TEST(ValidationDense, WrongRank) {
  Store s;
  auto p = dense_forward(s);
  p.q = s.make(DType::kFloat32, {10, 4, 8});
  expect_refused(s, p, "q has rank 3 (shape [10, 4, 8]); expected rank 4, [B, Lq, H, D]");
}

// Found by the fuzzing harness: a rank past kMaxRank made the message read past the shape array
// (a crash for large ranks), and a negative rank on an optional tensor passed for "not given".
TEST(ValidationDense, RanksOutsideZeroToSixAreRefused) {
  Store s;
  for (const int rank : {7, 1000, std::numeric_limits<int>::max()}) {
    auto p = dense_forward(s);
    p.q.rank = rank;
    expect_refused(s, p, "q has rank " + std::to_string(rank) +
                             "; expected 1..6 dimensions, or rank 0 for a tensor that is not given");
    p = dense_forward(s);
    p.options.bias.rank = rank;  // an optional tensor that is not given, with a rank that is no rank
    expect_refused(s, p, "options.bias has rank " + std::to_string(rank));
  }
  auto p = dense_forward(s);
  p.lse.rank = -1;
  expect_refused(s, p, "lse has rank -1; expected 1..6 dimensions");
  auto b = dense_backward(s);
  b.grads.dextra_v.rank = std::numeric_limits<int>::min();
  expect_refused(s, b, "grads.dextra_v has rank -2147483648");
  b = dense_backward(s);
  b.k.rank = -3;
  expect_refused(s, b, "k has rank -3");
}

TEST(ValidationDense, WrongDtypes) {
  Store s;
  auto p = dense_forward(s);
  p.q = s.make(DType::kInt32, {2, 5, 4, 8});
  expect_refused(s, p, "q has dtype int32; expected float32, float16 or bfloat16");
  p = dense_forward(s);
  p.k = s.make(DType::kFloat16, {2, 7, 2, 8});
  expect_refused(s, p, "k has dtype float16 but q has float32; k must have q's dtype");
  p = dense_forward(s);
  p.out = s.make(DType::kBFloat16, {2, 5, 4, 6});
  expect_refused(s, p, "out has dtype bfloat16 but q has float32");
  p = dense_forward(s);
  p.lse = s.make(DType::kFloat16, {2, 4, 5});
  expect_refused(s, p, "lse has dtype float16; expected float32");
  // float64 statistics only with a float64 problem.
  p = dense_forward(s, {.stat = DType::kFloat64});
  expect_refused(s, p, "lse has dtype float64; expected float32");
}

TEST(ValidationDense, MismatchedDevices) {
  Store s;
  auto p = dense_forward(s);
  p.k.device = Device::cuda(0);
  expect_refused(s, p, "k is on cuda:0 but q is on cpu; every tensor must be on q's device");
  p = dense_forward(s);
  p.lse.device = Device::cuda(1);
  expect_refused(s, p, "lse is on cuda:1 but q is on cpu");
}

// Found by the fuzzing harness (fuzz_api.cpp): a device type outside DeviceType, or a CUDA device
// with a negative index, passed check() when every tensor was on it (run() then dispatched it to
// the CUDA backend); float64 on such a device was refused as not supported on "cuda:0".
TEST(ValidationDense, DevicesThatDoNotExistAreRefused) {
  Store s;
  for (const Device device : {Device{static_cast<fmha::DeviceType>(7), 0}, Device::cuda(-1)}) {
    for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
      auto p = dense_forward(s, {.dtype = dtype});
      for (TensorView* t : {&p.q, &p.k, &p.v, &p.out, &p.lse}) t->device = device;
      expect_refused(s, p, "which is no device; expected cpu or cuda:<index> with an index >= 0");
    }
  }
  auto p = dense_forward(s);
  for (TensorView* t : {&p.q, &p.k, &p.v, &p.out, &p.lse}) t->device.type = static_cast<fmha::DeviceType>(7);
  expect_refused(s, p, "q is on device type 7:0, which is no device");
}

// Two CPU devices differ by their index: the message says which is which.
TEST(ValidationDense, CpuDeviceIndexIsShown) {
  Store s;
  auto p = dense_forward(s);
  p.k.device = {fmha::DeviceType::kCPU, 1};
  expect_refused(s, p, "k is on cpu:1 but q is on cpu; every tensor must be on q's device");
}

TEST(ValidationDense, Float64IsRefusedOnCuda) {
  Store s;
  auto p = dense_forward(s, {.dtype = DType::kFloat64});
  for (TensorView* t : {&p.q, &p.k, &p.v, &p.out, &p.lse}) t->device = Device::cuda(0);
  expect_refused(s, p, "dtype float64 is only supported on CPU tensors", StatusCode::kNotSupported);
}

// ---- Sizes ------------------------------------------------------------------------------------

TEST(ValidationDense, HeadsMustBeAMultipleOfKvHeads) {
  Store s;
  const auto p = dense_forward(s, {.H = 16, .Hkv = 6});
  const fmha::Status status = fmha::check(p);
  EXPECT_EQ(status.message(),
            "fmha: k has 6 heads but q has 16; q heads must be a multiple of k heads");
  expect_refused(s, p, "q heads must be a multiple of k heads");
}

TEST(ValidationDense, HeadDimsOutOfRange) {
  Store s;
  expect_refused(s, dense_forward(s, {.D = 300}), "head dim D = 300 (the last dimension of q)");
  expect_refused(s, dense_forward(s, {.D = 257}), "expected 1..256");
  expect_refused(s, dense_forward(s, {.Dv = 0}), "value head dim Dv = 0");
  expect_refused(s, dense_forward(s, {.H = 0}), "q has 0 heads; expected at least 1");
  expect_valid(dense_forward(s, {.D = 256, .Dv = 1}));
}

TEST(ValidationDense, MismatchedShapesNameTheDimension) {
  Store s;
  auto p = dense_forward(s);
  p.k = s.make(DType::kFloat32, {3, 7, 2, 8});
  expect_refused(s, p, "k has shape [3, 7, 2, 8]; expected [B, Lk, Hkv, D] = [2, 7, 2, 8]");
  p = dense_forward(s);
  p.k = s.make(DType::kFloat32, {2, 7, 2, 16});
  expect_refused(s, p, "(dimension 3, D, is 16 but must be 8)");
  p = dense_forward(s);
  p.v = s.make(DType::kFloat32, {2, 6, 2, 6});
  expect_refused(s, p, "(dimension 1, Lk, is 6 but must be 7)");
  p = dense_forward(s);
  p.out = s.make(DType::kFloat32, {2, 5, 4, 8});
  expect_refused(s, p, "out has shape [2, 5, 4, 8]; expected [B, Lq, H, Dv]");
  p = dense_forward(s);
  p.lse = s.make(DType::kFloat32, {2, 5, 4});
  expect_refused(s, p, "lse has shape [2, 5, 4]; expected [B, H, Lq] = [2, 4, 5]");
  p = dense_forward(s);
  p.q.shape[1] = -1;
  expect_refused(s, p, "q has size -1 on dimension 1");
}

// ---- Strides and memory -------------------------------------------------------------------------

TEST(ValidationDense, LastDimensionMustBeContiguous) {
  Store s;
  auto p = dense_forward(s);
  p.q = s.make_strided(DType::kFloat32, {2, 5, 4, 8}, {320, 64, 16, 2}, 640);
  expect_refused(s, p, "q has stride 2 on its last dimension (size 8)");
  p = dense_forward(s);
  p.v = s.make_strided(DType::kFloat32, {2, 7, 2, 6}, {84, 12, 6, 0}, 168);
  expect_refused(s, p, "v has stride 0 on its last dimension (size 6)");
}

TEST(ValidationDense, NegativeStrides) {
  Store s;
  auto p = dense_forward(s);
  p.k.stride[1] = -16;
  expect_refused(s, p, "k has stride -16 on dimension 1");
  expect_refused(s, p, "strides must be >= 0");
}

TEST(ValidationDense, OutputsMustNotShareMemory) {
  Store s;
  auto p = dense_forward(s);
  p.out = s.make_strided(DType::kFloat32, {2, 5, 4, 6}, {0, 24, 6, 1}, 120);
  expect_refused(s, p, "out has stride 0 on dimension 0 (size 2); an output cannot broadcast");
  p = dense_forward(s);
  p.out = s.make_strided(DType::kFloat32, {2, 5, 4, 6}, {120, 24, 3, 1}, 240);
  expect_refused(s, p, "under which different elements share memory");
  p = dense_forward(s);
  p.lse = s.make_strided(DType::kFloat32, {2, 4, 5}, {5, 0, 1}, 10);
  expect_refused(s, p, "lse has stride 0 on dimension 1");
}

TEST(ValidationDense, NullAndMisalignedData) {
  Store s;
  auto p = dense_forward(s);
  p.v.data = nullptr;
  expect_refused(s, p, "v has 168 elements but a null data pointer");
  p = dense_forward(s);
  p.q.data = static_cast<char*>(p.q.data) + 2;
  expect_refused(s, p, "which is not aligned to its float32 elements (4 bytes)");
}

TEST(ValidationDense, OffsetsMustFitInInt64) {
  Store s;
  auto p = dense_forward(s);
  p.k.stride[0] = std::numeric_limits<std::int64_t>::max() / 2;
  p.k.shape[0] = p.q.shape[0] = p.v.shape[0] = p.out.shape[0] = p.lse.shape[0] = 4;
  expect_refused(s, p, "reaches past 2^63 elements");
}

// ---- Options
// --------------------------------------------------------------------------------------

TEST(ValidationDense, ScalarOptions) {
  Store s;
  auto p = dense_forward(s);
  p.options.window_left = -2;
  expect_refused(s, p, "options.window_left = -2; expected -1 (unbounded) or a value >= 0");
  p = dense_forward(s);
  p.options.window_right = -5;
  expect_refused(s, p, "options.window_right = -5");
  p = dense_forward(s);
  p.options.softcap = -1.0f;
  expect_refused(s, p, "options.softcap = -1; expected a finite value >= 0");
  p.options.softcap = std::numeric_limits<float>::infinity();
  expect_refused(s, p, "options.softcap = inf");
  p = dense_forward(s);
  p.options.scale = std::numeric_limits<float>::quiet_NaN();
  expect_refused(s, p, "options.scale = nan; expected a finite value");
  p = dense_forward(s);
  p.options.causal_alignment = static_cast<fmha::CausalAlignment>(7);
  expect_refused(s, p, "options.causal_alignment = 7 is not a CausalAlignment");
}

TEST(ValidationDense, Bias) {
  Store s;
  auto p = dense_forward(s);
  p.options.bias = s.make(DType::kFloat32, {2, 4, 7, 5});
  expect_refused(s, p,
                 "options.bias has shape [2, 4, 7, 5]; expected [B, H, Lq, Lk] = [2, 4, 5, 7] "
                 "(dimension 2, Lq, is 7 but must be 5, or 1 to broadcast)");
  p.options.bias = s.make(DType::kFloat16, {2, 4, 5, 7});
  expect_refused(s, p, "options.bias has dtype float16 but q has float32");
  p.options.bias = s.make(DType::kFloat32, {4, 5, 7});
  expect_refused(s, p, "options.bias has rank 3");
  p.options.bias = s.make_strided(DType::kFloat32, {2, 4, 5, 7}, {140, 35, 7, 2}, 280);
  expect_refused(s, p, "options.bias has stride 2 on its last dimension (size 7)");
}

TEST(ValidationDense, RelativePositionBias) {
  Store s;
  auto p = dense_forward(s);
  p.options.rel_h = s.make(DType::kFloat32, {2, 4, 5, 7});
  expect_refused(s, p, "options.rel_h is given but options.rel_w is not");
  p.options.rel_h = {};
  p.options.rel_w = s.make(DType::kFloat32, {2, 4, 5, 7});
  expect_refused(s, p, "options.rel_w is given but options.rel_h is not");
  // Lk = 7 keys cannot form a 2 x 3 grid.
  p.options.rel_h = s.make(DType::kFloat32, {2, 4, 5, 2});
  p.options.rel_w = s.make(DType::kFloat32, {2, 4, 5, 3});
  expect_refused(s, p, "rel_pos shape does not match the key grid");
  expect_refused(s, p, "Hk = 2 and options.rel_w has Wk = 3 but there are Lk = 7 keys");
  p.options.rel_h = s.make(DType::kFloat32, {2, 4, 4, 7});
  p.options.rel_w = s.make(DType::kFloat32, {2, 4, 4, 1});
  expect_refused(s, p, "options.rel_h has shape [2, 4, 4, 7]; expected [B, H, Lq, Hk]");
}

TEST(ValidationDense, Sinks) {
  Store s;
  auto p = dense_forward(s);
  p.options.sinks = s.make(DType::kFloat32, {5});
  expect_refused(s, p, "options.sinks has shape [5]; expected [H] = [4]");
  p.options.sinks = s.make(DType::kFloat16, {4});
  expect_refused(s, p, "options.sinks has dtype float16; expected float32");
  auto p64 = dense_forward(s, {.dtype = DType::kFloat64});
  p64.options.sinks = s.make(DType::kFloat64, {4});
  expect_valid(p64);
  p64.options.sinks = s.make(DType::kFloat16, {4});
  expect_refused(s, p64, "expected float32 or float64 (q is float64)");
}

TEST(ValidationDense, ExtraKeys) {
  Store s;
  auto p = dense_forward(s);
  p.options.extra_k = s.make(DType::kFloat32, {2, 3, 2, 8});
  expect_refused(s, p, "options.extra_k is given but options.extra_v is not");
  p.options.extra_v = s.make(DType::kFloat32, {2, 4, 2, 6});
  expect_refused(s, p, "options.extra_v has shape [2, 4, 2, 6]; expected [B, R, Hkv, Dv]");
  expect_refused(s, p, "(dimension 1, R, is 4 but must be 3)");
  p.options.extra_v = s.make(DType::kFloat32, {2, 3, 2, 6});
  p.options.extra_k = s.make(DType::kFloat32, {2, 3, 4, 8});
  expect_refused(s, p, "(dimension 2, Hkv, is 4 but must be 2)");
}

// ---- Backward
// ---------------------------------------------------------------------------------------

TEST(ValidationDenseBackward, RequiresTheForwardResults) {
  Store s;
  auto p = dense_backward(s);
  p.lse = {};
  expect_refused(s, p, "lse is required but not given (rank 0); the backward pass needs");
  p = dense_backward(s);
  p.out = {};
  expect_refused(s, p, "out is required but not given");
  p = dense_backward(s);
  p.dout = {};
  expect_refused(s, p, "dout is required but not given");
  p = dense_backward(s);
  p.grads.dk = {};
  expect_refused(s, p, "grads.dk is required but not given");
}

TEST(ValidationDenseBackward, InputShapes) {
  Store s;
  auto p = dense_backward(s);
  p.dout = s.make(DType::kFloat32, {2, 5, 4, 8});
  expect_refused(s, p, "dout has shape [2, 5, 4, 8]; expected [B, Lq, H, Dv]");
  p = dense_backward(s);
  p.dlse = s.make(DType::kFloat32, {2, 4, 6});
  expect_refused(s, p, "dlse has shape [2, 4, 6]; expected [B, H, Lq]");
  p = dense_backward(s);
  p.dlse = s.make(DType::kFloat16, {2, 4, 5});
  expect_refused(s, p, "dlse has dtype float16; expected float32");
}

TEST(ValidationDenseBackward, GradientsNeedTheirInputs) {
  Store s;
  auto p = dense_backward(s);
  p.grads.dbias = s.make(DType::kFloat32, {2, 4, 5, 7});
  expect_refused(s, p, "grads.dbias is given but options.bias is not");
  p = dense_backward(s);
  p.grads.dsinks = s.make(DType::kFloat32, {4});
  expect_refused(s, p, "grads.dsinks is given but options.sinks is not");
  p = dense_backward(s);
  p.grads.drel_w = s.make(DType::kFloat32, {2, 4, 5, 7});
  expect_refused(s, p, "grads.drel_w is given but options.rel_w is not");
  p = dense_backward(s);
  p.grads.dextra_v = s.make(DType::kFloat32, {2, 3, 2, 6});
  expect_refused(s, p, "grads.dextra_v is given but options.extra_v is not");
}

TEST(ValidationDenseBackward, GradientShapesAndDtypes) {
  Store s;
  auto p = dense_backward(s);
  p.grads.dq = s.make(DType::kFloat32, {2, 5, 4, 6});
  expect_refused(s, p, "grads.dq has shape [2, 5, 4, 6]; expected [B, Lq, H, D]");
  p = dense_backward(s);
  p.grads.dv = s.make(DType::kFloat16, {2, 7, 2, 6});
  expect_refused(s, p, "grads.dv has dtype float16 but q has float32");
  p = dense_backward(s);
  p.options.sinks = s.make(DType::kFloat32, {4});
  p.grads.dsinks = s.make(DType::kFloat32, {2});
  expect_refused(s, p, "grads.dsinks has shape [2]; expected [H] = [4]");
  p = dense_backward(s);
  p.grads.dk = s.make_strided(DType::kFloat32, {2, 7, 2, 8}, {0, 16, 8, 1}, 112);
  expect_refused(s, p, "grads.dk has stride 0 on dimension 0 (size 2)");
}

TEST(ValidationDenseBackward, DbiasMustBroadcastExactlyWhereBiasDoes) {
  Store s;
  auto p = dense_backward(s);
  p.options.bias = s.make_strided(DType::kFloat32, {2, 4, 5, 7}, {0, 7, 0, 1}, 28);
  p.grads.dbias = s.make(DType::kFloat32, {2, 4, 5, 7});
  expect_refused(s, p,
                 "grads.dbias has stride 140 on dimension 0 (size 2) where options.bias "
                 "has stride 0; grads.dbias must have stride 0 exactly where options.bias "
                 "broadcasts");
  p.options.bias = s.make(DType::kFloat32, {2, 4, 5, 7});
  p.grads.dbias = s.make_strided(DType::kFloat32, {2, 4, 5, 7}, {0, 7, 0, 1}, 28);
  expect_refused(s, p,
                 "grads.dbias has stride 0 on dimension 0 (size 2) where options.bias has "
                 "stride 140");
  // dbias has the bias's own shape, not merely one that broadcasts to [B, H, Lq, Lk].
  p.grads.dbias = s.make(DType::kFloat32, {1, 4, 5, 7});
  expect_refused(s, p,
                 "grads.dbias has shape [1, 4, 5, 7]; expected [B, H, Lq, Lk] = [2, 4, 5, 7]");
  p.options.bias = s.make(DType::kFloat32, {1, 4, 5, 7});
  p.grads.dbias = s.make(DType::kFloat32, {2, 4, 5, 7});
  expect_refused(s, p,
                 "grads.dbias has shape [2, 4, 5, 7]; expected [B, H, Lq, Lk] = [1, 4, 5, 7]");
}

TEST(ValidationDenseBackward, BackwardImplMustBeKnown) {
  Store s;
  auto p = dense_backward(s);
  p.backward_impl = static_cast<fmha::BackwardImpl>(9);
  expect_refused(s, p, "backward_impl = 9 is not a BackwardImpl");
}

}  // namespace
}  // namespace fmha_validation
