// Varlen on CUDA under bad device offsets. cu_seqlens are read on the device only, so the kernels
// clamp what they read (sequence_rows in src/cuda/common/block_coords.cuh): offsets past the end,
// decreasing, negative, huge, or sequences longer than max_seqlen must give wrong numbers at worst,
// never an access outside the tensors. Every output here sits inside poisoned guard slices
// (cuda_guarded.h); a run must return ok, finish without a CUDA error and leave the guards and row
// padding untouched. Out-of-bounds reads and writes past the guards are what compute-sanitizer
// memcheck finds: scripts/gpu-check.sh runs these tests under it (its filter takes *Varlen*), on
// the Hopper kernels and again with FMHA_CUDA_KERNELS=sm80. Offsets that run past the end only
// give exactly the valid batch's results. With check_cu_seqlens the same offsets are refused
// before anything is written, with the message the CPU check gives.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_device_copy.h"
#include "cuda/cuda_forward_case.h"
#include "cuda/cuda_guarded.h"
#include "test_util.h"

namespace fmha_cuda_test {
namespace {

using fmha::BackwardImpl;
using fmha_test::HostTensor;

#define SKIP_WITHOUT_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present"

constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
constexpr std::int32_t kMin = std::numeric_limits<std::int32_t>::min();
constexpr std::int64_t kGuard = 48;  // guard slices on each side of every output
constexpr std::int64_t kPad = 8;     // padding after every output row

// A packed batch of 3 sequences: q lengths 10, 19, 11 (40 rows), k lengths 16, 23, 9 (48 rows); odd
// longest lengths, so that a length clamped to max_seqlen ends a key pair or a tile half way.
constexpr std::int64_t kBatch = 3, kTotalQ = 40, kTotalK = 48, kMaxQ = 19, kMaxK = 23;
constexpr std::int64_t kHeads = 4, kKvHeads = 2, kExtra = 3;

struct Offsets {
  const char* name;
  std::vector<std::int32_t> q, k;
};

const Offsets kValid{"valid", {0, 10, 29, 40}, {0, 16, 39, 48}};
// Past the end only: clamped to the row counts these are the valid offsets.
const Offsets kPastEnd{"past-end", {0, 10, 29, 200}, {0, 16, 39, 100000}};
const std::vector<Offsets> kBad{
    kPastEnd,
    {"decreasing", {0, 29, 10, 40}, {0, 39, 8, 48}},
    {"negative", {-50, 10, -3, 40}, {-1000, 16, -7, 48}},
    {"huge", {0, kMax, kMin, kMax}, {kMax, 0, kMax, kMin}},
    {"longer-than-max", {0, 40, 40, 40}, {0, 48, 48, 48}},
    {"all-empty", {40, 40, 40, 40}, {0, 0, 0, 0}},
};

HostTensor offsets_tensor(const std::vector<std::int32_t>& values) {
  HostTensor t(DType::kInt32, {static_cast<std::int64_t>(values.size())});
  for (std::size_t i = 0; i < values.size(); ++i) {
    t.set(static_cast<std::int64_t>(i), values[i]);
  }
  return t;
}

// The problem's scalar options and which optional inputs it has.
struct Features {
  const char* name;
  bool causal = false, bias = false, sinks = false, extra = false;
};
const Features kPlain{"plain"};
const Features kCausalBias{"causal-bias", true, true, false, false};
const Features kEverything{"causal-bias-sinks-extra", true, true, true, true};

struct Problem {
  DType dtype;
  std::int64_t head_dim;
  Features features;

  std::string describe() const {
    return std::string(fmha::to_string(dtype)) + " D" + std::to_string(head_dim) + " " + features.name;
  }
};

// The inputs of a problem (random, on the host and on the device; exact allocations, so that a read
// past one is memcheck's) and its device offsets.
struct Inputs {
  HostTensor q, k, v, out, lse, dout, bias, sinks, extra_k, extra_v, cu_q, cu_k;
  DeviceCopies copies;
  fmha::TensorView d_q, d_k, d_v, d_out, d_lse, d_dout, d_bias, d_sinks, d_extra_k, d_extra_v;
  fmha::TensorView d_cu_q, d_cu_k;

  Inputs(const Problem& p, const Offsets& offsets) {
    std::mt19937_64 rng(11);
    const DType t = p.dtype;
    const std::int64_t d = p.head_dim;
    q = HostTensor(t, {kTotalQ, kHeads, d});
    k = HostTensor(t, {kTotalK, kKvHeads, d});
    v = HostTensor(t, {kTotalK, kKvHeads, d});
    out = HostTensor(t, {kTotalQ, kHeads, d});  // a forward's output, for the backward
    lse = HostTensor(DType::kFloat32, {kHeads, kTotalQ});
    dout = HostTensor(t, {kTotalQ, kHeads, d});
    for (HostTensor* x : {&q, &k, &v, &out, &dout}) x->fill_uniform(rng, -1.0, 1.0);
    lse.fill_uniform(rng, 1.0, 3.0);
    if (p.features.bias) {
      // Rows of 24 elements for 23 keys: pair-aligned (the sm90 register-form bias policies).
      fmha_test::Layout padded;
      padded.pad = 1;
      bias = HostTensor(t, {kBatch, kHeads, kMaxQ, kMaxK}, padded);
      bias.fill_uniform(rng, -1.0, 1.0);
    }
    if (p.features.sinks) {
      sinks = HostTensor(DType::kFloat32, {kHeads});
      sinks.fill_uniform(rng, -1.0, 1.0);
    }
    if (p.features.extra) {
      extra_k = HostTensor(t, {kBatch, kExtra, kKvHeads, d});
      extra_v = HostTensor(t, {kBatch, kExtra, kKvHeads, d});
      extra_k.fill_uniform(rng, -1.0, 1.0);
      extra_v.fill_uniform(rng, -1.0, 1.0);
    }
    cu_q = offsets_tensor(offsets.q);
    cu_k = offsets_tensor(offsets.k);
    d_q = copies.upload(q), d_k = copies.upload(k), d_v = copies.upload(v);
    d_out = copies.upload(out), d_lse = copies.upload(lse), d_dout = copies.upload(dout);
    d_bias = copies.upload(bias), d_sinks = copies.upload(sinks);
    d_extra_k = copies.upload(extra_k), d_extra_v = copies.upload(extra_v);
    d_cu_q = copies.upload(cu_q), d_cu_k = copies.upload(cu_k);
  }

  fmha::AttentionOptions options(const Problem& p, bool device) {
    fmha::AttentionOptions o;
    o.causal = p.features.causal;
    o.causal_alignment = fmha::CausalAlignment::kBottomRight;
    o.bias = device ? d_bias : bias.view();
    o.sinks = device ? d_sinks : sinks.view();
    o.extra_k = device ? d_extra_k : extra_k.view();
    o.extra_v = device ? d_extra_v : extra_v.view();
    return o;
  }
};

// The forward's outputs, guarded.
struct ForwardOutputs {
  GuardedOutput out, lse;
  ForwardOutputs(const Problem& p, DeviceCopies* copies)
      : out(p.dtype, {kTotalQ, kHeads, p.head_dim}, 0, kGuard, kPad, copies),
        lse(DType::kFloat32, {kHeads, kTotalQ}, 1, kGuard, 0, copies) {}
};

fmha::VarlenForwardParams forward_params(const Problem& p, Inputs& in, const ForwardOutputs& o) {
  fmha::VarlenForwardParams f;
  f.q = in.d_q, f.k = in.d_k, f.v = in.d_v;
  f.cu_seqlens_q = in.d_cu_q, f.cu_seqlens_k = in.d_cu_k;
  f.max_seqlen_q = kMaxQ, f.max_seqlen_k = kMaxK;
  f.out = o.out.view(), f.lse = o.lse.view();
  f.options = in.options(p, /*device=*/true);
  return f;
}

// Runs and waits; the status must be ok and the device free of errors.
template <typename Params>
void run_and_sync(const Params& params, const std::string& what) {
  const fmha::Status s = fmha::run(params, nullptr);
  ASSERT_TRUE(s.ok()) << what << ": " << s.message();
  const cudaError_t synced = cudaDeviceSynchronize();
  ASSERT_EQ(synced, cudaSuccess) << what << ": " << cudaGetErrorString(synced);
  const cudaError_t last = cudaGetLastError();
  ASSERT_EQ(last, cudaSuccess) << what << ": " << cudaGetErrorString(last);
}

// out and lse of the problem on `offsets`, after checking that nothing outside them was written.
std::vector<std::vector<double>> forward_on(const Problem& p, const Offsets& offsets) {
  SCOPED_TRACE(std::string("offsets ") + offsets.name);
  Inputs in(p, offsets);
  ForwardOutputs o(p, &in.copies);
  run_and_sync(forward_params(p, in, o), std::string("forward on ") + offsets.name);
  if (::testing::Test::HasFatalFailure()) return {};
  o.out.download();
  o.lse.download();
  EXPECT_TRUE(o.out.untouched_outside("out"));
  EXPECT_TRUE(o.lse.untouched_outside("lse"));
  return {o.out.values(), o.lse.values()};
}

class CudaForwardVarlenSafety : public ::testing::TestWithParam<Problem> {};

TEST_P(CudaForwardVarlenSafety, BadOffsetsStayInsideTheTensors) {
  SKIP_WITHOUT_GPU();
  const Problem& p = GetParam();
  SCOPED_TRACE(p.describe());
  const std::vector<std::vector<double>> valid = forward_on(p, kValid);
  for (const Offsets& offsets : kBad) {
    const std::vector<std::vector<double>> got = forward_on(p, offsets);
    if (::testing::Test::HasFatalFailure()) return;
    if (&offsets == &kBad.front()) {  // past the end only: the valid batch's results, bit for bit
      EXPECT_EQ(got, valid) << "past-end offsets clamped to the row counts differ from the valid run";
    }
  }
}

// The backward's gradients, guarded.
struct Gradients {
  GuardedOutput dq, dk, dv;
  std::unique_ptr<GuardedOutput> dbias, dsinks, dextra_k, dextra_v;
  Gradients(const Problem& p, DeviceCopies* copies)
      : dq(p.dtype, {kTotalQ, kHeads, p.head_dim}, 0, kGuard, kPad, copies),
        dk(p.dtype, {kTotalK, kKvHeads, p.head_dim}, 0, kGuard, kPad, copies),
        dv(p.dtype, {kTotalK, kKvHeads, p.head_dim}, 0, kGuard, kPad, copies) {
    if (p.features.bias) {  // guards around the query rows of every (b, h)
      dbias = std::make_unique<GuardedOutput>(
          p.dtype, std::vector<std::int64_t>{kBatch, kHeads, kMaxQ, kMaxK}, 2, 8, kPad, copies);
    }
    if (p.features.sinks) {
      dsinks = std::make_unique<GuardedOutput>(DType::kFloat32, std::vector<std::int64_t>{kHeads},
                                               0, kGuard, 0, copies);
    }
    if (p.features.extra) {
      const std::vector<std::int64_t> shape{kBatch, kExtra, kKvHeads, p.head_dim};
      dextra_k = std::make_unique<GuardedOutput>(p.dtype, shape, 0, 2, kPad, copies);
      dextra_v = std::make_unique<GuardedOutput>(p.dtype, shape, 0, 2, kPad, copies);
    }
  }
  std::vector<std::pair<const char*, GuardedOutput*>> all() {
    std::vector<std::pair<const char*, GuardedOutput*>> g{{"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
    if (dbias) g.emplace_back("dbias", dbias.get());
    if (dsinks) g.emplace_back("dsinks", dsinks.get());
    if (dextra_k) g.emplace_back("dextra_k", dextra_k.get());
    if (dextra_v) g.emplace_back("dextra_v", dextra_v.get());
    return g;
  }
};

// The backward implementations a varlen batch can take: fused (sm90: by column at buckets 64 and
// 128, the sm80 fused kernels elsewhere and with dbias), split, and deterministic (split, ordered).
struct Impl {
  const char* name;
  BackwardImpl impl;
  bool deterministic;
};
const Impl kImpls[] = {{"fused", BackwardImpl::kFused, false},
                       {"split", BackwardImpl::kSplit, false},
                       {"deterministic", BackwardImpl::kAuto, true}};

fmha::VarlenBackwardParams backward_params(const Problem& p, Inputs& in, Gradients& g,
                                           const Impl& impl) {
  fmha::VarlenBackwardParams b;
  b.q = in.d_q, b.k = in.d_k, b.v = in.d_v;
  b.cu_seqlens_q = in.d_cu_q, b.cu_seqlens_k = in.d_cu_k;
  b.max_seqlen_q = kMaxQ, b.max_seqlen_k = kMaxK;
  b.out = in.d_out, b.lse = in.d_lse, b.dout = in.d_dout;
  b.options = in.options(p, /*device=*/true);
  b.options.deterministic = impl.deterministic;
  b.backward_impl = impl.impl;
  b.grads.dq = g.dq.view(), b.grads.dk = g.dk.view(), b.grads.dv = g.dv.view();
  if (g.dbias) b.grads.dbias = g.dbias->view();
  if (g.dsinks) b.grads.dsinks = g.dsinks->view();
  if (g.dextra_k) b.grads.dextra_k = g.dextra_k->view();
  if (g.dextra_v) b.grads.dextra_v = g.dextra_v->view();
  return b;
}

// dq, dk, dv of the problem on `offsets` with one implementation, after checking that no gradient
// was written outside its view.
std::vector<std::vector<double>> backward_on(const Problem& p, const Offsets& offsets,
                                             const Impl& impl) {
  SCOPED_TRACE(std::string("offsets ") + offsets.name + ", backward " + impl.name);
  Inputs in(p, offsets);
  Gradients g(p, &in.copies);
  run_and_sync(backward_params(p, in, g, impl), std::string("backward on ") + offsets.name);
  if (::testing::Test::HasFatalFailure()) return {};
  std::vector<std::vector<double>> values;
  for (auto& [name, grad] : g.all()) {
    grad->download();
    EXPECT_TRUE(grad->untouched_outside(name));
    if (values.size() < 3) values.push_back(grad->values());
  }
  return values;
}

class CudaBackwardVarlenSafety : public ::testing::TestWithParam<Problem> {};

TEST_P(CudaBackwardVarlenSafety, BadOffsetsStayInsideTheTensors) {
  SKIP_WITHOUT_GPU();
  const Problem& p = GetParam();
  SCOPED_TRACE(p.describe());
  for (const Impl& impl : kImpls) {
    const std::vector<std::vector<double>> valid = backward_on(p, kValid, impl);
    for (const Offsets& offsets : kBad) {
      const std::vector<std::vector<double>> got = backward_on(p, offsets, impl);
      if (::testing::Test::HasFatalFailure()) return;
      if (&offsets != &kBad.front() || got.size() != valid.size()) continue;
      // Past the end only: the valid batch's gradients; bit for bit where the backward is
      // deterministic, elsewhere up to the order of fp32 atomic sums (a unit in the last place of
      // some elements; a wrong sequence would be off by the values themselves).
      const char* names[] = {"dq", "dk", "dv"};
      for (std::size_t n = 0; n < got.size(); ++n) {
        if (!impl.deterministic) {
          const std::vector<std::int64_t> shape{static_cast<std::int64_t>(got[n].size())};
          EXPECT_TRUE(fmha_test::close(names[n], got[n], valid[n], shape, 1e-2));
        } else {
          EXPECT_EQ(got[n], valid[n]) << names[n] << " (" << impl.name
                                      << "): past-end offsets differ from the valid run";
        }
      }
    }
  }
}

// fp16 on two head-dim buckets (sm90: both fused-by-column buckets), bf16, and fp32 (the sm80
// kernels on every arch); each plain and with every score option a varlen batch takes (on sm90
// the backward's extra keys run the sm80 kernels); a bias and its gradient alone (the sm90 bias
// policies) in fp16.
std::vector<Problem> problems() {
  std::vector<Problem> list;
  for (const Features& f : {kPlain, kEverything}) {
    list.push_back({DType::kFloat16, 64, f});
    list.push_back({DType::kFloat16, 128, f});
    list.push_back({DType::kBFloat16, 64, f});
    list.push_back({DType::kFloat32, 64, f});
  }
  list.push_back({DType::kFloat16, 64, kCausalBias});
  list.push_back({DType::kFloat16, 128, kCausalBias});
  return list;
}

// "Plain_Float16_D64": the dtype as the suite's filters spell it (gpu-check's second passes on
// other kernel paths leave out *Float32*, which runs the sm80 kernels everywhere).
std::string problem_name(const ::testing::TestParamInfo<Problem>& info) {
  const DType t = info.param.dtype;
  const char* dtype = t == DType::kFloat32 ? "Float32" : t == DType::kBFloat16 ? "BFloat16" : "Float16";
  std::string name = std::string(info.param.features.name) + "_" + dtype + "_D" +
                     std::to_string(info.param.head_dim);
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Problems, CudaForwardVarlenSafety, ::testing::ValuesIn(problems()),
                         problem_name);
INSTANTIATE_TEST_SUITE_P(Problems, CudaBackwardVarlenSafety, ::testing::ValuesIn(problems()),
                         problem_name);

// ---- check_cu_seqlens: the opt-in host check ---------------------------------------------------

// The message fmha::check gives for the same offsets on CPU tensors (the check every CPU call gets).
std::string cpu_message(const Problem& p, Inputs& in) {
  fmha::VarlenForwardParams f;
  f.q = in.q.view(), f.k = in.k.view(), f.v = in.v.view();
  f.cu_seqlens_q = in.cu_q.view(), f.cu_seqlens_k = in.cu_k.view();
  f.max_seqlen_q = kMaxQ, f.max_seqlen_k = kMaxK;
  f.out = in.out.view(), f.lse = in.lse.view();
  f.options = in.options(p, /*device=*/false);
  return fmha::check(f).message();
}

TEST(CudaVarlenHostCheck, RefusesBadOffsetsWithTheCpuMessage) {
  SKIP_WITHOUT_GPU();
  const Problem p{DType::kFloat16, 64, kEverything};
  for (const Offsets& offsets : kBad) {
    SCOPED_TRACE(std::string("offsets ") + offsets.name);
    Inputs in(p, offsets);
    const std::string expected = cpu_message(p, in);
    ASSERT_NE(expected, "") << "the CPU check accepts these offsets";

    ForwardOutputs o(p, &in.copies);
    fmha::VarlenForwardParams f = forward_params(p, in, o);
    f.check_cu_seqlens = true;
    fmha::Status s = fmha::run(f, nullptr);
    EXPECT_EQ(s.code(), fmha::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), expected);

    Gradients g(p, &in.copies);
    fmha::VarlenBackwardParams b = backward_params(p, in, g, kImpls[1]);
    b.check_cu_seqlens = true;
    s = fmha::run(b, nullptr);
    EXPECT_EQ(s.code(), fmha::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), expected);

    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // Refused before anything was written: every output still holds the poison.
    o.out.download();
    o.lse.download();
    for (auto& [name, grad] : g.all()) grad->download();
    const auto all_poison = [](const GuardedOutput& x) {
      for (double value : x.values()) {
        if (!std::isnan(value)) return false;
      }
      return true;
    };
    EXPECT_TRUE(all_poison(o.out) && all_poison(o.lse)) << "the refused forward wrote its outputs";
    for (auto& [name, grad] : g.all()) {
      EXPECT_TRUE(all_poison(*grad)) << "the refused backward wrote " << name;
    }
  }
}

TEST(CudaVarlenHostCheck, AcceptsValidOffsets) {
  SKIP_WITHOUT_GPU();
  const Problem p{DType::kBFloat16, 64, kEverything};
  Inputs in(p, kValid);
  ForwardOutputs o(p, &in.copies);
  fmha::VarlenForwardParams f = forward_params(p, in, o);
  f.check_cu_seqlens = true;
  run_and_sync(f, "checked forward");
  if (::testing::Test::HasFatalFailure()) return;
  Gradients g(p, &in.copies);
  fmha::VarlenBackwardParams b = backward_params(p, in, g, kImpls[1]);
  b.check_cu_seqlens = true;
  run_and_sync(b, "checked backward");
  if (::testing::Test::HasFatalFailure()) return;
  // The checked runs equal unchecked ones bit for bit.
  o.out.download();
  const std::vector<double> checked_out = o.out.values();
  o.out.repoison();
  f.check_cu_seqlens = false;
  run_and_sync(f, "unchecked forward");
  if (::testing::Test::HasFatalFailure()) return;
  o.out.download();
  EXPECT_EQ(o.out.values(), checked_out);
  for (auto& [name, grad] : g.all()) {
    grad->download();
    for (double value : grad->values()) {
      ASSERT_TRUE(std::isfinite(value)) << name << ": an element left unwritten";
    }
  }
}

}  // namespace
}  // namespace fmha_cuda_test
