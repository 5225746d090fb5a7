// Neighborhood attention backward on CUDA (SPEC §6, §11) against the CPU reference: the CUDA
// forward makes out and lse, the CUDA backward (fused and split) turns dout and dlse into every
// gradient, and each gradient is compared with fmha::run of the forward and backward on float64
// CPU copies of the same inputs, within SPEC §13's bound: 2 x the error of the naive same-dtype
// computation (tests/naive, S, P, dP, dS rounded to the dtype) + 1e-4, plus the error of merely
// storing the exact gradient in its dtype. Gradients are poisoned with NaN before every run.
// 1-D, 2-D and 3-D grids, dilation that does not divide the grid, kernel = grid (dense), per-axis
// causality, odd grids, GQA, extra keys, sinks, softcap, bias / rel-pos over the flattened grid
// with their gradients, deterministic mode (bitwise-equal reruns).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_device_copy.h"
#include "naive/naive_problem.h"
#include "test_case.h"

namespace fmha_cuda_test {
namespace {

using fmha::BackwardImpl;
using fmha::DType;
using fmha_test::AttentionCase;
using fmha_test::CaseTensors;
using fmha_test::HostTensor;

bool gpu_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present"

AttentionCase na_case(DType dtype, int dims, std::array<std::int64_t, 3> grid,
                      std::array<std::int64_t, 3> kernel, std::array<std::int64_t, 3> dilation,
                      std::array<bool, 3> causal = {false, false, false}) {
  AttentionCase c;
  c.kind = fmha_test::Kind::kNeighborhood;
  c.dtype = dtype;
  c.batch = 2;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 64;
  c.value_dim = 64;
  c.grid = grid;
  c.neighborhood = {
      .num_dims = dims, .kernel_size = kernel, .dilation = dilation, .causal = causal};
  c.dlse = true;
  return c;
}

using Member = HostTensor CaseTensors::*;
constexpr Member kInputs[] = {&CaseTensors::q,     &CaseTensors::k,       &CaseTensors::v,
                              &CaseTensors::bias,  &CaseTensors::rel_h,   &CaseTensors::rel_w,
                              &CaseTensors::sinks, &CaseTensors::extra_k, &CaseTensors::extra_v,
                              &CaseTensors::dout,  &CaseTensors::dlse};
constexpr Member kOutputs[] = {&CaseTensors::out, &CaseTensors::lse};
struct Gradient {
  Member member;
  const char* name;
  std::vector<double> naive::Gradients::*lowp;
};
constexpr Gradient kGradients[] = {
    {&CaseTensors::dq, "dq", &naive::Gradients::dq},
    {&CaseTensors::dk, "dk", &naive::Gradients::dk},
    {&CaseTensors::dv, "dv", &naive::Gradients::dv},
    {&CaseTensors::dsinks, "dsinks", &naive::Gradients::dsinks},
    {&CaseTensors::dextra_k, "dextra_k", &naive::Gradients::dextra_k},
    {&CaseTensors::dextra_v, "dextra_v", &naive::Gradients::dextra_v},
    {&CaseTensors::dbias, "dbias", &naive::Gradients::dbias},
    {&CaseTensors::drel_h, "drel_h", &naive::Gradients::drel_h},
    {&CaseTensors::drel_w, "drel_w", &naive::Gradients::drel_w}};

// Device copies of every tensor of a case, with the host strides.
class DeviceCase {
 public:
  explicit DeviceCase(CaseTensors& t) {
    for (Member m : kInputs) upload(t, m);
    for (Member m : kOutputs) upload(t, m);
    for (const Gradient& g : kGradients) upload(t, g.member);
  }
  const fmha::TensorView& operator[](Member m) const {
    for (const auto& [member, view] : views_)
      if (member == m) return view;
    return none_;
  }
  // Host contents -> device (re-poisoning a gradient between runs).
  void reset(HostTensor& h, Member m) const {
    const std::size_t bytes = storage_bytes((*this)[m]);
    if (bytes > 0) {
      EXPECT_EQ(fmha_cuda_test::copy_to_device((*this)[m].data, h.view().data, bytes),
                cudaSuccess);
    }
  }

 private:
  void upload(CaseTensors& t, Member m) { views_.emplace_back(m, copies_.upload(t.*m)); }
  DeviceCopies copies_;
  std::vector<std::pair<Member, fmha::TensorView>> views_;
  fmha::TensorView none_;
};

fmha::AttentionOptions options_of(const AttentionCase& c, const DeviceCase& d) {
  fmha::AttentionOptions o = c.options;
  o.bias = d[&CaseTensors::bias];
  o.rel_h = d[&CaseTensors::rel_h];
  o.rel_w = d[&CaseTensors::rel_w];
  o.sinks = d[&CaseTensors::sinks];
  o.extra_k = d[&CaseTensors::extra_k];
  o.extra_v = d[&CaseTensors::extra_v];
  return o;
}

fmha::NeighborhoodBackwardParams backward_params(const AttentionCase& c, const DeviceCase& d,
                                                 BackwardImpl impl) {
  fmha::NeighborhoodBackwardParams p;
  p.q = d[&CaseTensors::q];
  p.k = d[&CaseTensors::k];
  p.v = d[&CaseTensors::v];
  p.out = d[&CaseTensors::out];
  p.lse = d[&CaseTensors::lse];
  p.dout = d[&CaseTensors::dout];
  p.dlse = d[&CaseTensors::dlse];
  p.neighborhood = c.neighborhood;
  p.options = options_of(c, d);
  p.backward_impl = impl;
  p.grads = {.dq = d[&CaseTensors::dq],
             .dk = d[&CaseTensors::dk],
             .dv = d[&CaseTensors::dv],
             .dbias = d[&CaseTensors::dbias],
             .drel_h = d[&CaseTensors::drel_h],
             .drel_w = d[&CaseTensors::drel_w],
             .dsinks = d[&CaseTensors::dsinks],
             .dextra_k = d[&CaseTensors::dextra_k],
             .dextra_v = d[&CaseTensors::dextra_v]};
  return p;
}

// The naive dbias is per element of [B, H, N, N]; a dimension where dbias broadcasts by stride 0
// (the only broadcast these tests use, so the shapes agree) holds the sum over it.
std::vector<double> sum_broadcast(const std::vector<double>& full, const HostTensor& like) {
  const std::vector<std::int64_t>& shape = like.shape();
  auto key = [&](std::size_t index) {
    const std::vector<std::int64_t> at =
        fmha_test::unravel(static_cast<std::int64_t>(index), shape);
    std::int64_t flat = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      flat = flat * shape[d] + (like.broadcast_dim(static_cast<int>(d)) ? 0 : at[d]);
    }
    return static_cast<std::size_t>(flat);
  };
  std::vector<double> sums(full.size(), 0.0), out(full.size());
  for (std::size_t n = 0; n < full.size(); ++n) sums[key(n)] += full[n];
  for (std::size_t n = 0; n < full.size(); ++n) out[n] = sums[key(n)];
  return out;
}

// SPEC §13: 2 x the naive same-dtype error + 1e-4, plus the error of storing the exact result.
// dsinks takes the 1e-4 as an absolute floor (see test_cuda_backward.cpp: a sum whose terms
// cancel, with a luck-dependent naive baseline).
double bound(const std::vector<double>& ref, const std::vector<double>& lowp, DType storage,
             bool absolute_floor) {
  std::vector<double> stored(ref.size());
  double norm = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    stored[i] = fmha_test::round_to(storage, ref[i]);
    norm += ref[i] * ref[i];
  }
  const double rms = ref.empty() ? 0 : std::sqrt(norm / static_cast<double>(ref.size()));
  const double floor = absolute_floor && rms > 0 ? std::max(1e-4, 1e-4 / rms) : 1e-4;
  return 2 * fmha_test::compare(lowp, ref, 0).rel_error +
         fmha_test::compare(stored, ref, 0).rel_error + floor;
}

const char* impl_name(BackwardImpl impl) {
  return impl == BackwardImpl::kFused ? "fused" : impl == BackwardImpl::kSplit ? "split" : "auto";
}

// Runs the case's forward and backward on the GPU, once per implementation, and checks every
// gradient; with `twice`, reruns each implementation and requires identical bits.
void check_na_backward(const AttentionCase& c, std::uint64_t seed, bool twice = false) {
  SCOPED_TRACE("case: " + c.describe() + " seed=" + std::to_string(seed));
  CaseTensors t = fmha_test::make_tensors(c, seed);

  // Reference: the CPU backend in float64 (statistics too) on the same input values.
  AttentionCase c64 = c;
  c64.dtype = DType::kFloat64;
  c64.fp32_stats = false;
  CaseTensors r = fmha_test::make_tensors(c64, seed);
  for (Member m : kInputs) {
    if ((t.*m).defined()) (r.*m).from_double((t.*m).to_double());
  }
  fmha::Status s = fmha_test::run_forward(c64, r);
  ASSERT_TRUE(s.ok()) << "CPU reference forward refused: " << s.message();
  s = fmha_test::run_backward(c64, r);
  ASSERT_TRUE(s.ok()) << "CPU reference backward refused: " << s.message();

  // The naive same-dtype baseline of the tolerance.
  const naive::Problem problem = fmha_test::naive_problem(c, t);
  const naive::Round round = fmha_test::naive_rounding(c.dtype);
  const naive::Forward lowp_forward = naive::forward(problem, round);
  const std::vector<double> dlse =
      t.dlse.defined() ? fmha_test::lse_from_library(c, t.dlse.to_double()) : std::vector<double>{};
  naive::Gradients lowp = naive::backward(problem, lowp_forward, t.dout.to_double(), dlse, round);
  if (t.dbias.defined()) lowp.dbias = sum_broadcast(lowp.dbias, t.dbias);

  t.out.poison();
  t.lse.poison();
  DeviceCase dev(t);
  if (::testing::Test::HasFailure()) return;
  const fmha::NeighborhoodForwardParams forward{.q = dev[&CaseTensors::q],
                                                .k = dev[&CaseTensors::k],
                                                .v = dev[&CaseTensors::v],
                                                .out = dev[&CaseTensors::out],
                                                .lse = dev[&CaseTensors::lse],
                                                .neighborhood = c.neighborhood,
                                                .options = options_of(c, dev)};
  s = fmha::run(forward, nullptr);
  ASSERT_TRUE(s.ok()) << "CUDA neighborhood forward refused: " << s.message();

  const std::vector<BackwardImpl> impls =
      c.options.deterministic
          ? std::vector<BackwardImpl>{BackwardImpl::kAuto}
          : std::vector<BackwardImpl>{BackwardImpl::kFused, BackwardImpl::kSplit};
  for (BackwardImpl impl : impls) {
    std::vector<HostTensor> first(std::size(kGradients));
    for (int run = 0; run < (twice ? 2 : 1); ++run) {
      for (const Gradient& g : kGradients) {
        HostTensor& h = t.*g.member;
        if (!h.defined()) continue;
        h.poison();
        dev.reset(h, g.member);
      }
      s = fmha::run(backward_params(c, dev, impl), nullptr);
      ASSERT_TRUE(s.ok()) << "CUDA neighborhood backward (" << impl_name(impl)
                          << ") refused: " << s.message();
      const cudaError_t synced = cudaDeviceSynchronize();
      ASSERT_EQ(synced, cudaSuccess) << cudaGetErrorString(synced);
      for (std::size_t n = 0; n < std::size(kGradients); ++n) {
        const Gradient& g = kGradients[n];
        HostTensor& h = t.*g.member;
        if (!h.defined()) continue;
        DeviceCopies::download(h, dev[g.member]);
        if (run > 0) {
          EXPECT_TRUE(h.bitwise_equal(first[n]))
              << g.name << " differs between two identical " << impl_name(impl) << " runs";
          continue;
        }
        first[n] = h;
        const std::vector<double> got = h.to_double(), ref = (r.*g.member).to_double();
        // fp32 problems: SPEC §13's fixed 1e-5 (the naive fp32 baseline would allow 1e-4).
        const double tol = c.dtype == DType::kFloat32 ? 1e-5
                                                      : bound(ref, lowp.*g.lowp, h.dtype(),
                                                              std::string(g.name) == "dsinks");
        const fmha_test::ErrorStats st = fmha_test::compare(got, ref, tol);
        std::printf("[ errors ] %-8s %-5s rel %.3e  bound %.3e  max_abs %.3e  | %s\n", g.name,
                    impl_name(impl), st.rel_error, tol, st.max_abs, c.describe().c_str());
        EXPECT_TRUE(fmha_test::close(g.name, got, ref, h.shape(), tol)) << impl_name(impl);
        EXPECT_TRUE(h.padding_untouched()) << g.name << ": an element outside the view was written";
      }
    }
  }
}

TEST(CudaNeighborhoodBackwardSmall, OneDim) {
  SKIP_WITHOUT_GPU();
  check_na_backward(na_case(DType::kFloat16, 1, {13, 1, 1}, {3, 1, 1}, {1, 1, 1}), 1);
  check_na_backward(na_case(DType::kBFloat16, 1, {13, 1, 1}, {4, 1, 1}, {3, 1, 1}), 2);
  check_na_backward(
      na_case(DType::kFloat16, 1, {13, 1, 1}, {5, 1, 1}, {2, 1, 1}, {true, false, false}), 3);
  check_na_backward(na_case(DType::kBFloat16, 1, {11, 1, 1}, {11, 1, 1}, {1, 1, 1}), 4);
}

TEST(CudaNeighborhoodBackwardSmall, TwoAndThreeDim) {
  SKIP_WITHOUT_GPU();
  check_na_backward(na_case(DType::kFloat16, 2, {7, 9, 1}, {3, 5, 1}, {1, 1, 1}), 11);
  check_na_backward(na_case(DType::kBFloat16, 2, {7, 9, 1}, {2, 4, 1}, {2, 2, 1}), 12);
  check_na_backward(
      na_case(DType::kFloat16, 2, {8, 7, 1}, {3, 2, 1}, {2, 3, 1}, {true, false, false}), 13);
  check_na_backward(na_case(DType::kFloat16, 3, {4, 5, 6}, {3, 2, 3}, {1, 2, 2}), 14);
  check_na_backward(
      na_case(DType::kBFloat16, 3, {5, 4, 5}, {2, 3, 2}, {2, 1, 2}, {true, false, true}), 15);
}

TEST(CudaNeighborhoodBackward, Larger) {
  SKIP_WITHOUT_GPU();
  // Many key tiles and query tiles: 1-D long, 2-D with dilation not dividing the grid, 3-D.
  check_na_backward(na_case(DType::kFloat16, 1, {1000, 1, 1}, {7, 1, 1}, {1, 1, 1}), 21);
  check_na_backward(
      na_case(DType::kBFloat16, 1, {577, 1, 1}, {9, 1, 1}, {5, 1, 1}, {true, false, false}), 22);
  check_na_backward(na_case(DType::kFloat16, 2, {17, 23, 1}, {5, 7, 1}, {3, 2, 1}), 23);
  check_na_backward(
      na_case(DType::kBFloat16, 2, {33, 47, 1}, {7, 8, 1}, {2, 1, 1}, {false, true, false}), 24);
  check_na_backward(
      na_case(DType::kFloat16, 3, {6, 7, 9}, {3, 4, 2}, {2, 1, 3}, {false, true, false}), 25);
}

// One long axis without dilation: the dense kernels' shifting window (neighborhood.cu).
TEST(CudaNeighborhoodBackward, OneAxisWindows) {
  SKIP_WITHOUT_GPU();
  check_na_backward(na_case(DType::kBFloat16, 1, {1000, 1, 1}, {999, 1, 1}, {1, 1, 1}), 26);
  check_na_backward(na_case(DType::kFloat16, 1, {777, 1, 1}, {254, 1, 1}, {1, 1, 1}), 27);
  check_na_backward(na_case(DType::kBFloat16, 2, {1, 517, 1}, {1, 131, 1}, {1, 1, 1}), 28);
  check_na_backward(
      na_case(DType::kFloat16, 1, {700, 1, 1}, {200, 1, 1}, {1, 1, 1}, {true, false, false}), 29);
  AttentionCase c = na_case(DType::kFloat16, 1, {613, 1, 1}, {201, 1, 1}, {1, 1, 1});
  c.extra = 5;
  c.sinks = true;
  c.options.softcap = 10.0f;
  c.bias.given = true;
  c.heads = 4;
  check_na_backward(c, 30);
}

// Dilated windows wider than a block: boxes of queries of one dilation group that see a key box
// whole (no mask), next to partial boxes and holes.
TEST(CudaNeighborhoodBackward, DilatedWideWindows) {
  SKIP_WITHOUT_GPU();
  check_na_backward(na_case(DType::kFloat16, 1, {1000, 1, 1}, {300, 1, 1}, {3, 1, 1}), 71);
  check_na_backward(na_case(DType::kBFloat16, 2, {48, 40, 1}, {23, 19, 1}, {2, 2, 1}), 72);
}

// Dilation groups as window masks (neighborhood.cu, dilation_groups). As the batches of one
// launch: GQA with sinks (dsinks sums over the group batches), causal with a group-sized kernel
// and bitwise-equal reruns, D 128. One launch a group: batches of two with sinks (dsinks added
// over the launches), a ragged grid with bitwise-equal reruns. Extra keys, whose gradients keep
// the token tiles in the backward after a forward on the groups; a dilation above 16.
TEST(CudaNeighborhoodBackward, DilationGroups) {
  SKIP_WITHOUT_GPU();
  AttentionCase gqa = na_case(DType::kFloat16, 1, {1200, 1, 1}, {255, 1, 1}, {4, 1, 1});
  gqa.batch = 1;
  gqa.heads = 4;
  gqa.kv_heads = 2;
  gqa.sinks = true;
  check_na_backward(gqa, 73);
  AttentionCase whole =
      na_case(DType::kBFloat16, 1, {999, 1, 1}, {111, 1, 1}, {9, 1, 1}, {true, false, false});
  whole.batch = 1;
  check_na_backward(whole, 74, /*twice=*/true);
  AttentionCase wide = na_case(DType::kBFloat16, 1, {2048, 1, 1}, {129, 1, 1}, {8, 1, 1});
  wide.batch = 1;
  wide.head_dim = wide.value_dim = 128;
  check_na_backward(wide, 75);
  AttentionCase batches = na_case(DType::kFloat16, 1, {1203, 1, 1}, {200, 1, 1}, {6, 1, 1});
  batches.sinks = true;
  batches.heads = 4;
  check_na_backward(batches, 76);
  AttentionCase ragged =
      na_case(DType::kBFloat16, 1, {1001, 1, 1}, {250, 1, 1}, {4, 1, 1}, {true, false, false});
  ragged.batch = 1;
  check_na_backward(ragged, 77, /*twice=*/true);
  AttentionCase axis = na_case(DType::kFloat16, 2, {1, 960, 1}, {1, 119, 1}, {1, 8, 1});
  axis.batch = 1;
  axis.extra = 3;
  check_na_backward(axis, 78);
  check_na_backward(na_case(DType::kBFloat16, 1, {700, 1, 1}, {21, 1, 1}, {17, 1, 1}), 79);
}

// Kernel = grid on every axis: every key visible, so the gradients are dense attention's.
TEST(CudaNeighborhoodBackward, KernelEqualsGridIsDense) {
  SKIP_WITHOUT_GPU();
  check_na_backward(na_case(DType::kFloat16, 2, {16, 16, 1}, {16, 16, 1}, {1, 1, 1}), 31);
  check_na_backward(na_case(DType::kBFloat16, 3, {3, 4, 5}, {3, 4, 5}, {1, 1, 1}), 32);
  check_na_backward(na_case(DType::kFloat16, 1, {300, 1, 1}, {300, 1, 1}, {1, 1, 1}), 33);
}

TEST(CudaNeighborhoodBackward, HeadDimsAndGqa) {
  SKIP_WITHOUT_GPU();
  for (auto [d, dv] : {std::pair<int, int>{32, 32}, {128, 64}, {80, 80}, {256, 256}, {8, 40}}) {
    AttentionCase c =
        na_case(DType::kFloat16, 2, {9, 11, 1}, {3, 5, 1}, {2, 1, 1}, {false, true, false});
    c.head_dim = d;
    c.value_dim = dv;
    c.heads = 4;
    c.kv_heads = 2;
    check_na_backward(c, 41);
  }
  AttentionCase c = na_case(DType::kBFloat16, 1, {70, 1, 1}, {5, 1, 1}, {1, 1, 1});
  c.heads = 6;
  c.kv_heads = 1;  // MQA
  check_na_backward(c, 42);
}

TEST(CudaNeighborhoodBackward, ExtraKeysSinksSoftcapBiasRelPos) {
  SKIP_WITHOUT_GPU();
  AttentionCase c =
      na_case(DType::kFloat16, 2, {6, 5, 1}, {3, 2, 1}, {2, 2, 1}, {false, true, false});
  c.extra = 3;
  check_na_backward(c, 51);
  c.sinks = true;
  c.extra = 70;  // more than one tile of extra keys
  c.options.softcap = 3.0f;
  c.options.scale = 0.5f;
  c.dtype = DType::kBFloat16;
  check_na_backward(c, 52);
  c.bias.given = true;
  c.rel_hk = 6;  // the key grid itself: Hk = X1, Wk = X2
  check_na_backward(c, 53);
  c.bias = {.given = true, .broadcast = {true, false, true, false}, .zero_stride = true};
  c.rel_hk = 0;
  c.dtype = DType::kFloat16;
  check_na_backward(c, 54);
  AttentionCase big = na_case(DType::kBFloat16, 3, {6, 7, 9}, {3, 3, 3}, {1, 2, 3});
  big.extra = 5;
  big.sinks = true;
  big.options.softcap = 10.0f;
  check_na_backward(big, 55);
}

// fp32 (tf32 tensor cores, 3xTF32 split): 1-3 D grids, head dims up to 256 (shared memory past
// 99 KB), GQA, extra keys, sinks, softcap, bias and rel-pos.
TEST(CudaNeighborhoodBackward, Float32) {
  SKIP_WITHOUT_GPU();
  const DType f = DType::kFloat32;
  check_na_backward(na_case(f, 1, {13, 1, 1}, {5, 1, 1}, {2, 1, 1}, {true, false, false}), 71);
  check_na_backward(na_case(f, 2, {17, 23, 1}, {5, 7, 1}, {3, 2, 1}), 72);
  check_na_backward(na_case(f, 3, {5, 4, 5}, {2, 3, 2}, {2, 1, 2}, {true, false, true}), 73);
  for (auto [d, dv] : {std::pair<int, int>{32, 32}, {128, 64}, {256, 256}, {8, 40}}) {
    AttentionCase c = na_case(f, 2, {9, 11, 1}, {3, 5, 1}, {2, 1, 1}, {false, true, false});
    c.head_dim = d;
    c.value_dim = dv;
    c.heads = 4;
    c.kv_heads = 2;
    check_na_backward(c, 74);
  }
  AttentionCase c = na_case(f, 2, {6, 5, 1}, {3, 2, 1}, {2, 2, 1}, {false, true, false});
  c.sinks = true;
  c.extra = 70;
  c.options.softcap = 3.0f;
  c.bias.given = true;
  c.rel_hk = 6;
  check_na_backward(c, 75);
}

TEST(CudaNeighborhoodBackwardSmall, Deterministic) {
  SKIP_WITHOUT_GPU();
  AttentionCase c =
      na_case(DType::kFloat16, 2, {17, 13, 1}, {5, 3, 1}, {2, 3, 1}, {false, true, false});
  c.options.deterministic = true;
  c.extra = 4;
  c.sinks = true;
  c.bias.given = true;  // full size: each dbias element gets one contribution
  check_na_backward(c, 61, /*twice=*/true);
  // Without score modifiers or extra keys (Hopper: the sm90 split kernels), sinks and GQA. dsinks
  // has one entry a head, each a sum over every query: with few heads its norm-wise error is a
  // ratio of two small random samples (ours against the naive baseline's), so many heads.
  AttentionCase plain =
      na_case(DType::kBFloat16, 2, {24, 20, 1}, {7, 5, 1}, {1, 2, 1}, {false, false, true});
  plain.options.deterministic = true;
  plain.sinks = true;
  plain.heads = 16;
  plain.kv_heads = 4;
  check_na_backward(plain, 62, /*twice=*/true);
}

// Grids of many boxes a block with kernels of the benchmark's kind (2-D 13 x 13, 3-D 5 x 5 x 5),
// sinks: whole seen boxes next to partial ones in both tilings.
TEST(CudaNeighborhoodBackward, ManyBoxes) {
  SKIP_WITHOUT_GPU();
  AttentionCase c = na_case(DType::kBFloat16, 2, {40, 36, 1}, {13, 13, 1}, {1, 1, 1});
  c.sinks = true;
  check_na_backward(c, 81);
  check_na_backward(na_case(DType::kFloat16, 3, {10, 12, 12}, {5, 5, 5}, {1, 2, 1}), 82);
  check_na_backward(na_case(DType::kBFloat16, 1, {2500, 1, 1}, {255, 1, 1}, {4, 1, 1}), 83);
}

}  // namespace
}  // namespace fmha_cuda_test
