// The CUDA backward (sm80 mma.sync kernels, fused and split) against the CPU reference: the CUDA
// forward makes out and lse on the GPU, the CUDA backward turns dout (and dlse) into every
// gradient, and each gradient is compared with fmha::run of the backward on float64 CPU copies
// (the forward recomputed in float64 too) within SPEC §13's bound: 2 x the error of the naive
// same-dtype computation (tests/naive with S, P, dP, dS rounded to the dtype) + 1e-4, plus the
// error of merely storing the exact gradient in its dtype. Outputs are poisoned with NaN first.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fmha/fmha.h"
#include "naive/naive_masks.h"
#include "naive/naive_problem.h"
#include "test_util.h"

namespace {

using fmha::BackwardImpl;
using fmha::CausalAlignment;
using fmha::DType;
using fmha_test::HostTensor;
using fmha_test::Layout;

struct BackwardCase {
  DType dtype = DType::kFloat16;
  std::int64_t batch = 1, heads = 2, kv_heads = 1, head_dim = 64, value_dim = 64;
  std::int64_t seqlen_q = 17, seqlen_k = 17;     // dense
  std::vector<std::int32_t> varlen_q, varlen_k;  // non-empty: a varlen batch of these lengths
  fmha::AttentionOptions options;                // scalar options; tensors filled in here
  bool dlse = true;
  bool sinks = false;
  std::int64_t extra = 0;                                          // R extra keys
  bool bias = false;                                               // an additive bias
  std::array<bool, 4> bias_broadcast{false, false, false, false};  // stride-0 dims of [B,H,Lq,Lk]
  bool dbias = false;                                              // request its gradient
  std::int64_t rel_hk = 0;  // > 0: rel_h / rel_w over a key grid Hk x (Lk / Hk)
  bool drel = false;        // request drel_h / drel_w
  Layout q_layout, kv_layout, grad_layout;
  std::vector<BackwardImpl> impls{BackwardImpl::kFused, BackwardImpl::kSplit};

  bool varlen() const { return !varlen_q.empty(); }
  std::int64_t batches() const {
    return varlen() ? static_cast<std::int64_t>(varlen_q.size()) : batch;
  }
  std::int64_t rows_q() const {
    return varlen() ? *std::max_element(varlen_q.begin(), varlen_q.end()) : seqlen_q;
  }
  std::int64_t rows_k() const {
    return varlen() ? *std::max_element(varlen_k.begin(), varlen_k.end()) : seqlen_k;
  }
  std::string describe() const;
};

std::string BackwardCase::describe() const {
  std::ostringstream s;
  s << fmha::to_string(dtype) << ' ';
  if (varlen()) {
    s << "varlen q[";
    for (auto l : varlen_q) s << l << ',';
    s << "] k[";
    for (auto l : varlen_k) s << l << ',';
    s << ']';
  } else {
    s << 'B' << batch << " Lq" << seqlen_q << " Lk" << seqlen_k;
  }
  s << " H" << heads << '/' << kv_heads << " D" << head_dim << " Dv" << value_dim;
  if (options.scale) s << " scale" << *options.scale;
  if (options.causal) s << " causal";
  if (options.causal_alignment == CausalAlignment::kBottomRight) s << "(br)";
  if (options.window_left >= 0 || options.window_right >= 0)
    s << " window(" << options.window_left << ',' << options.window_right << ')';
  if (options.softcap > 0) s << " softcap" << options.softcap;
  if (options.deterministic) s << " deterministic";
  if (options.allow_tf32) s << " allow_tf32";
  if (!dlse) s << " no-dlse";
  if (sinks) s << " sinks";
  if (extra > 0) s << " extra" << extra;
  if (bias) {
    s << (dbias ? " dbias" : " bias");
    for (bool x : bias_broadcast) s << (x ? '0' : '.');
  }
  if (rel_hk > 0) s << (drel ? " drel" : " relpos") << rel_hk;
  if (!q_layout.order.empty() || q_layout.pad) s << " q-strided";
  if (kv_layout.pad || !kv_layout.broadcast.empty()) s << " kv-strided";
  if (grad_layout.pad) s << " grads-padded";
  return s.str();
}

bool gpu_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present"

#define CUDA_CHECK(expr)                                                   \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

// Every tensor of one problem, host side. Gradients and forward outputs share the names of the
// library's parameters.
struct Tensors {
  HostTensor q, k, v, out, lse, dout, dlse, sinks, extra_k, extra_v, bias, rel_h, rel_w, cu_q, cu_k;
  HostTensor dq, dk, dv, dsinks, dextra_k, dextra_v, dbias, drel_h, drel_w;
};

HostTensor cu_seqlens(const std::vector<std::int32_t>& lengths) {
  HostTensor t(DType::kInt32, {static_cast<std::int64_t>(lengths.size()) + 1});
  std::int64_t sum = 0;
  t.set(0, 0);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    sum += lengths[b];
    t.set(static_cast<std::int64_t>(b) + 1, static_cast<double>(sum));
  }
  return t;
}

std::int64_t total(const std::vector<std::int32_t>& lengths) {
  std::int64_t n = 0;
  for (auto l : lengths) n += l;
  return n;
}

// Allocates every tensor in `dtype` (statistics in `stat`), random inputs, NaN-poisoned outputs.
Tensors make_tensors(const BackwardCase& c, DType dtype, DType stat, std::mt19937_64* rng) {
  const std::int64_t b = c.batches(), h = c.heads, hkv = c.kv_heads;
  const std::int64_t d = c.head_dim, dv = c.value_dim;
  Tensors t;
  std::vector<std::int64_t> qs, ks, vs, os, ls;
  if (c.varlen()) {
    const std::int64_t tq = total(c.varlen_q), tk = total(c.varlen_k);
    qs = {tq, h, d}, ks = {tk, hkv, d}, vs = {tk, hkv, dv}, os = {tq, h, dv}, ls = {h, tq};
    t.cu_q = cu_seqlens(c.varlen_q);
    t.cu_k = cu_seqlens(c.varlen_k);
  } else {
    qs = {b, c.seqlen_q, h, d}, ks = {b, c.seqlen_k, hkv, d}, vs = {b, c.seqlen_k, hkv, dv};
    os = {b, c.seqlen_q, h, dv}, ls = {b, h, c.seqlen_q};
  }
  t.q = HostTensor(dtype, qs, c.q_layout);
  t.k = HostTensor(dtype, ks, c.kv_layout);
  t.v = HostTensor(dtype, vs, c.kv_layout);
  t.out = HostTensor(dtype, os);
  t.lse = HostTensor(stat, ls);
  t.dout = HostTensor(dtype, os, c.q_layout);
  t.dq = HostTensor(dtype, qs, c.grad_layout);
  t.dk = HostTensor(dtype, ks, c.grad_layout);
  t.dv = HostTensor(dtype, vs, c.grad_layout);
  t.q.fill_uniform(*rng, -1, 1);
  t.k.fill_uniform(*rng, -1, 1);
  t.v.fill_uniform(*rng, -1, 1);
  t.dout.fill_uniform(*rng, -1, 1);
  if (c.dlse) {
    t.dlse = HostTensor(stat, ls);
    t.dlse.fill_uniform(*rng, -0.5, 0.5);
  }
  if (c.sinks) {
    t.sinks = HostTensor(DType::kFloat32, {h});
    t.sinks.fill_uniform(*rng, -1, 2);
    t.dsinks = HostTensor(stat, {h});
  }
  if (c.extra > 0) {
    t.extra_k = HostTensor(dtype, {b, c.extra, hkv, d});
    t.extra_v = HostTensor(dtype, {b, c.extra, hkv, dv});
    t.extra_k.fill_uniform(*rng, -1, 1);
    t.extra_v.fill_uniform(*rng, -1, 1);
    t.dextra_k = HostTensor(dtype, {b, c.extra, hkv, d});
    t.dextra_v = HostTensor(dtype, {b, c.extra, hkv, dv});
  }
  if (c.bias) {
    Layout layout;
    layout.broadcast.assign(c.bias_broadcast.begin(), c.bias_broadcast.end());
    t.bias = HostTensor(dtype, {b, h, c.rows_q(), c.rows_k()}, layout);
    t.bias.fill_uniform(*rng, -2, 2);
    if (c.dbias) t.dbias = HostTensor(dtype, {b, h, c.rows_q(), c.rows_k()}, layout);
  }
  if (c.rel_hk > 0) {
    t.rel_h = HostTensor(dtype, {b, h, c.rows_q(), c.rel_hk});
    t.rel_w = HostTensor(dtype, {b, h, c.rows_q(), c.rows_k() / c.rel_hk});
    t.rel_h.fill_uniform(*rng, -1, 1);
    t.rel_w.fill_uniform(*rng, -1, 1);
    if (c.drel) {
      t.drel_h = HostTensor(dtype, t.rel_h.shape());
      t.drel_w = HostTensor(dtype, t.rel_w.shape());
    }
  }
  for (HostTensor* o : {&t.out, &t.lse, &t.dq, &t.dk, &t.dv, &t.dsinks, &t.dextra_k, &t.dextra_v,
                        &t.dbias, &t.drel_h, &t.drel_w})
    if (o->defined()) o->poison();
  return t;
}

// Same values, another dtype (the float64 reference copy).
void copy_values(const HostTensor& from, HostTensor* to) {
  if (from.defined()) to->from_double(from.to_double());
}

// The views handed to fmha::run, from host tensors or their device copies.
struct Views {
  fmha::TensorView q, k, v, out, lse, dout, dlse, sinks, extra_k, extra_v, bias, rel_h, rel_w;
  fmha::TensorView cu_q, cu_k, dq, dk, dv, dsinks, dextra_k, dextra_v, dbias, drel_h, drel_w;
};
constexpr std::pair<HostTensor Tensors::*, fmha::TensorView Views::*> kMembers[] = {
    {&Tensors::q, &Views::q},
    {&Tensors::k, &Views::k},
    {&Tensors::v, &Views::v},
    {&Tensors::out, &Views::out},
    {&Tensors::lse, &Views::lse},
    {&Tensors::dout, &Views::dout},
    {&Tensors::dlse, &Views::dlse},
    {&Tensors::sinks, &Views::sinks},
    {&Tensors::extra_k, &Views::extra_k},
    {&Tensors::extra_v, &Views::extra_v},
    {&Tensors::bias, &Views::bias},
    {&Tensors::cu_q, &Views::cu_q},
    {&Tensors::cu_k, &Views::cu_k},
    {&Tensors::dq, &Views::dq},
    {&Tensors::dk, &Views::dk},
    {&Tensors::dv, &Views::dv},
    {&Tensors::dsinks, &Views::dsinks},
    {&Tensors::dextra_k, &Views::dextra_k},
    {&Tensors::dextra_v, &Views::dextra_v},
    {&Tensors::rel_h, &Views::rel_h},
    {&Tensors::rel_w, &Views::rel_w},
    {&Tensors::dbias, &Views::dbias},
    {&Tensors::drel_h, &Views::drel_h},
    {&Tensors::drel_w, &Views::drel_w}};

Views host_views(Tensors& t) {
  Views v;
  for (const auto& [member, view] : kMembers) v.*view = (t.*member).view();
  return v;
}

std::size_t storage_bytes(const fmha::TensorView& v) {
  std::int64_t elements = 1;
  for (int d = 0; d < v.rank; ++d) {
    if (v.shape[static_cast<std::size_t>(d)] == 0) return 0;
    elements += (v.shape[static_cast<std::size_t>(d)] - 1) * v.stride[static_cast<std::size_t>(d)];
  }
  return static_cast<std::size_t>(elements) * fmha::element_size(v.dtype);
}

class DeviceTensors {
 public:
  ~DeviceTensors() {
    for (void* p : allocations_) cudaFree(p);
  }
  void upload(Tensors& t) {
    for (const auto& [member, view] : kMembers) {
      HostTensor& h = t.*member;
      if (!h.defined()) continue;
      fmha::TensorView dv = h.view();
      const std::size_t bytes = storage_bytes(dv);
      void* p = nullptr;
      CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)));
      allocations_.push_back(p);
      if (bytes > 0) CUDA_CHECK(cudaMemcpy(p, dv.data, bytes, cudaMemcpyHostToDevice));
      dv.data = p;
      dv.device = fmha::Device::cuda(0);
      views_.*view = dv;
    }
  }
  // Host contents -> device for one tensor already uploaded (re-poisoning between runs).
  void reset(HostTensor& h, const fmha::TensorView& dv) {
    const std::size_t bytes = storage_bytes(dv);
    if (bytes > 0) CUDA_CHECK(cudaMemcpy(dv.data, h.view().data, bytes, cudaMemcpyHostToDevice));
  }
  void download(HostTensor& h, const fmha::TensorView& dv) {
    const std::size_t bytes = storage_bytes(dv);
    if (bytes > 0) CUDA_CHECK(cudaMemcpy(h.view().data, dv.data, bytes, cudaMemcpyDeviceToHost));
  }
  const Views& views() const { return views_; }

 private:
  std::vector<void*> allocations_;
  Views views_;
};

fmha::AttentionOptions options_of(const BackwardCase& c, const Views& v) {
  fmha::AttentionOptions o = c.options;
  o.sinks = v.sinks;
  o.extra_k = v.extra_k;
  o.extra_v = v.extra_v;
  o.bias = v.bias;
  o.rel_h = v.rel_h;
  o.rel_w = v.rel_w;
  return o;
}

fmha::Status run_forward(const BackwardCase& c, const Views& v) {
  const fmha::AttentionOptions o = options_of(c, v);
  if (c.varlen()) {
    fmha::VarlenForwardParams p{.q = v.q,
                                .k = v.k,
                                .v = v.v,
                                .cu_seqlens_q = v.cu_q,
                                .cu_seqlens_k = v.cu_k,
                                .max_seqlen_q = c.rows_q(),
                                .max_seqlen_k = c.rows_k(),
                                .out = v.out,
                                .lse = v.lse,
                                .options = o};
    return fmha::run(p, nullptr);
  }
  fmha::AttentionForwardParams p{
      .q = v.q, .k = v.k, .v = v.v, .out = v.out, .lse = v.lse, .options = o};
  return fmha::run(p, nullptr);
}

fmha::Status run_backward(const BackwardCase& c, const Views& v, BackwardImpl impl) {
  const fmha::AttentionOptions o = options_of(c, v);
  fmha::AttentionGradients g;
  g.dq = v.dq, g.dk = v.dk, g.dv = v.dv, g.dsinks = v.dsinks;
  g.dextra_k = v.dextra_k, g.dextra_v = v.dextra_v;
  g.dbias = v.dbias, g.drel_h = v.drel_h, g.drel_w = v.drel_w;
  if (c.varlen()) {
    fmha::VarlenBackwardParams p{.q = v.q,
                                 .k = v.k,
                                 .v = v.v,
                                 .cu_seqlens_q = v.cu_q,
                                 .cu_seqlens_k = v.cu_k,
                                 .max_seqlen_q = c.rows_q(),
                                 .max_seqlen_k = c.rows_k(),
                                 .out = v.out,
                                 .lse = v.lse,
                                 .dout = v.dout,
                                 .dlse = v.dlse,
                                 .options = o,
                                 .backward_impl = impl,
                                 .grads = g};
    return fmha::run(p, nullptr);
  }
  fmha::AttentionBackwardParams p{.q = v.q,
                                  .k = v.k,
                                  .v = v.v,
                                  .out = v.out,
                                  .lse = v.lse,
                                  .dout = v.dout,
                                  .dlse = v.dlse,
                                  .options = o,
                                  .backward_impl = impl,
                                  .grads = g};
  return fmha::run(p, nullptr);
}

double round_fp16(double x) {
  return fmha_test::round_to(DType::kFloat16, x);
}
double round_bf16(double x) {
  return fmha_test::round_to(DType::kBFloat16, x);
}

// Library statistics index ([B, H, Lq] or varlen [H, total_q]) of naive row `row`, head `h`.
std::int64_t stat_index(const BackwardCase& c, std::int64_t rows, std::int64_t row,
                        std::int64_t h) {
  if (c.varlen()) return h * rows + row;
  return (row / c.seqlen_q * c.heads + h) * c.seqlen_q + row % c.seqlen_q;
}

// The naive same-dtype gradients (S, P, dP, dS and every stored result rounded to the dtype);
// none for fp32, whose bound is fixed (expect_close).
naive::Gradients naive_low_precision(const BackwardCase& c, const Tensors& t) {
  if (c.dtype == DType::kFloat32) return {};
  naive::Problem p;
  p.heads = c.heads;
  p.kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.value_dim = c.value_dim;
  p.batch = c.batches();
  p.rows_q = c.varlen() ? total(c.varlen_q) : c.batch * c.seqlen_q;
  p.rows_k = c.varlen() ? total(c.varlen_k) : c.batch * c.seqlen_k;
  std::int64_t q0 = 0, k0 = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const auto bi = static_cast<std::size_t>(b);
    const std::int64_t lq = c.varlen() ? c.varlen_q[bi] : c.seqlen_q;
    const std::int64_t lk = c.varlen() ? c.varlen_k[bi] : c.seqlen_k;
    p.segments.push_back({.batch = b, .q_begin = q0, .q_len = lq, .k_begin = k0, .k_len = lk});
    q0 += lq;
    k0 += lk;
  }
  p.q = t.q.to_double();
  p.k = t.k.to_double();
  p.v = t.v.to_double();
  p.num_extra = c.extra;
  if (c.extra > 0) {
    p.extra_k = t.extra_k.to_double();
    p.extra_v = t.extra_v.to_double();
  }
  p.bias_rows = c.rows_q();
  p.bias_cols = c.rows_k();
  if (c.bias) p.bias = t.bias.to_double();
  if (c.rel_hk > 0) {
    p.rel_h = t.rel_h.to_double();
    p.rel_w = t.rel_w.to_double();
    p.rel_hk = c.rel_hk;
    p.rel_wk = c.rows_k() / c.rel_hk;
  }
  if (c.sinks) p.sinks = t.sinks.to_double();
  p.scale = c.options.scale ? *c.options.scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  p.softcap = c.options.softcap;
  const fmha::AttentionOptions o = c.options;
  p.mask = [o](const naive::Segment& s) {
    return naive::attention_mask(s.q_len, s.k_len, o.causal,
                                 o.causal_alignment == CausalAlignment::kBottomRight, o.window_left,
                                 o.window_right);
  };
  const naive::Round round = c.dtype == DType::kFloat16 ? round_fp16 : round_bf16;
  const naive::Forward f = naive::forward(p, round);
  std::vector<double> dlse;
  if (c.dlse) {
    const std::vector<double> lib = t.dlse.to_double();
    dlse.resize(static_cast<std::size_t>(p.rows_q * c.heads));
    for (std::int64_t row = 0; row < p.rows_q; ++row)
      for (std::int64_t h = 0; h < c.heads; ++h)
        dlse[static_cast<std::size_t>(row * c.heads + h)] =
            lib[static_cast<std::size_t>(stat_index(c, p.rows_q, row, h))];
  }
  naive::Gradients g = naive::backward(p, f, t.dout.to_double(), dlse, round);
  if (c.dbias) {
    // The naive dbias is per element; a broadcast dimension of dbias holds the sum over it.
    const std::vector<std::int64_t> shape = {p.batch, c.heads, c.rows_q(), c.rows_k()};
    auto collapsed = [&](std::size_t index) {
      const std::vector<std::int64_t> at =
          fmha_test::unravel(static_cast<std::int64_t>(index), shape);
      std::int64_t flat = 0;
      for (std::size_t d = 0; d < 4; ++d) {
        flat = flat * shape[d] + (c.bias_broadcast[d] ? 0 : at[d]);
      }
      return static_cast<std::size_t>(flat);
    };
    std::vector<double> sums(g.dbias.size(), 0.0);
    for (std::size_t n = 0; n < g.dbias.size(); ++n) sums[collapsed(n)] += g.dbias[n];
    for (std::size_t n = 0; n < g.dbias.size(); ++n) g.dbias[n] = round(sums[collapsed(n)]);
  }
  return g;
}

// SPEC §13: 2 x the naive same-dtype error + 1e-4, plus the error of storing the exact result.
// `absolute_floor`: the 1e-4 taken as SPEC §13 writes it, absolute (turned into a norm-wise
// relative floor); used for dsinks only, a sum over every row of P_sink * Delta whose terms
// cancel, so that the fp16 rounding of `out` inside each Delta (shared by every implementation,
// naive or not) weighs on a small total with a luck-dependent naive baseline.
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

// SPEC §13 for fp32 inputs: norm-wise 1e-5 for every gradient, 2e-3 with allow_tf32.
void expect_close(const char* name, const BackwardCase& c, const char* impl, const HostTensor& got,
                  const HostTensor& ref, const std::vector<double>& lowp) {
  const std::vector<double> g = got.to_double(), r = ref.to_double();
  const double tol = c.dtype == DType::kFloat32
                         ? (c.options.allow_tf32 ? 2e-3 : 1e-5)
                         : bound(r, lowp, got.dtype(), std::string(name) == "dsinks");
  const fmha_test::ErrorStats st = fmha_test::compare(g, r, tol);
  std::printf("[ errors ] %-8s %-5s rel %.3e  bound %.3e  max_abs %.3e  | %s\n", name, impl,
              st.rel_error, tol, st.max_abs, c.describe().c_str());
  EXPECT_TRUE(fmha_test::close(name, g, r, got.shape(), tol)) << impl;
}

const char* impl_name(BackwardImpl impl) {
  switch (impl) {
    case BackwardImpl::kFused:
      return "fused";
    case BackwardImpl::kSplit:
      return "split";
    default:
      return "auto";
  }
}

constexpr HostTensor Tensors::*kGradients[] = {
    &Tensors::dq,       &Tensors::dk,    &Tensors::dv,     &Tensors::dsinks, &Tensors::dextra_k,
    &Tensors::dextra_v, &Tensors::dbias, &Tensors::drel_h, &Tensors::drel_w};
constexpr const char* kGradientNames[] = {"dq",       "dk",    "dv",     "dsinks", "dextra_k",
                                          "dextra_v", "dbias", "drel_h", "drel_w"};
constexpr fmha::TensorView Views::*kGradientViews[] = {
    &Views::dq,       &Views::dk,    &Views::dv,     &Views::dsinks, &Views::dextra_k,
    &Views::dextra_v, &Views::dbias, &Views::drel_h, &Views::drel_w};

// Runs the case's forward and backward on the GPU, once per implementation in c.impls, and checks
// every gradient; with `twice`, runs each implementation again and requires identical bits.
void check_backward(const BackwardCase& c, std::uint64_t seed, bool twice = false) {
  SCOPED_TRACE("case: " + c.describe() + " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Tensors t = make_tensors(c, c.dtype, DType::kFloat32, &rng);

  // Reference: the CPU backend in float64, forward then backward, on the same input values.
  std::mt19937_64 unused(0);
  Tensors ref = make_tensors(c, DType::kFloat64, DType::kFloat64, &unused);
  for (HostTensor Tensors::*m :
       {&Tensors::q, &Tensors::k, &Tensors::v, &Tensors::dout, &Tensors::dlse, &Tensors::extra_k,
        &Tensors::extra_v, &Tensors::bias, &Tensors::rel_h, &Tensors::rel_w})
    copy_values(t.*m, &(ref.*m));
  if (c.sinks) ref.sinks = t.sinks;
  const Views ref_views = host_views(ref);
  fmha::Status s = run_forward(c, ref_views);
  ASSERT_TRUE(s.ok()) << "CPU reference forward refused: " << s.message();
  s = run_backward(c, ref_views, BackwardImpl::kAuto);
  ASSERT_TRUE(s.ok()) << "CPU reference backward refused: " << s.message();
  const naive::Gradients lowp = naive_low_precision(c, t);
  const std::vector<double>* lowp_of[] = {&lowp.dq,     &lowp.dk,       &lowp.dv,
                                          &lowp.dsinks, &lowp.dextra_k, &lowp.dextra_v,
                                          &lowp.dbias,  &lowp.drel_h,   &lowp.drel_w};

  DeviceTensors dev;
  dev.upload(t);
  if (::testing::Test::HasFatalFailure()) return;
  s = run_forward(c, dev.views());
  ASSERT_TRUE(s.ok()) << "CUDA forward refused: " << s.message();
  for (BackwardImpl impl : c.impls) {
    std::vector<HostTensor> first(std::size(kGradients));
    for (int run = 0; run < (twice ? 2 : 1); ++run) {
      for (std::size_t n = 0; n < std::size(kGradients); ++n) {
        HostTensor& g = t.*kGradients[n];
        if (!g.defined()) continue;
        g.poison();
        dev.reset(g, dev.views().*kGradientViews[n]);
      }
      s = run_backward(c, dev.views(), impl);
      ASSERT_TRUE(s.ok()) << "CUDA backward (" << impl_name(impl) << ") refused: " << s.message();
      CUDA_CHECK(cudaDeviceSynchronize());
      for (std::size_t n = 0; n < std::size(kGradients); ++n) {
        HostTensor& g = t.*kGradients[n];
        if (!g.defined()) continue;
        dev.download(g, dev.views().*kGradientViews[n]);
        if (run == 0) {
          expect_close(kGradientNames[n], c, impl_name(impl), g, ref.*kGradients[n], *lowp_of[n]);
          first[n] = g;
        } else {
          EXPECT_TRUE(g.bitwise_equal(first[n]))
              << kGradientNames[n] << " differs between two identical " << impl_name(impl)
              << " runs";
        }
      }
    }
  }
}

BackwardCase shape_case(DType dtype, std::int64_t lq, std::int64_t lk, std::int64_t d,
                        std::int64_t dv, std::int64_t h, std::int64_t hkv, std::int64_t b = 1) {
  BackwardCase c;
  c.dtype = dtype;
  c.batch = b;
  c.seqlen_q = lq;
  c.seqlen_k = lk;
  c.head_dim = d;
  c.value_dim = dv;
  c.heads = h;
  c.kv_heads = hkv;
  return c;
}

TEST(CudaBackward, OddShapesAndHeadDims) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    check_backward(shape_case(dt, 1, 1, 64, 64, 2, 1), 1);
    check_backward(shape_case(dt, 17, 113, 40, 40, 8, 2), 2);
    check_backward(shape_case(dt, 113, 17, 80, 80, 4, 1, 2), 3);
    check_backward(shape_case(dt, 239, 113, 128, 128, 8, 2), 4);
    check_backward(shape_case(dt, 113, 239, 256, 256, 4, 1), 5);
    check_backward(shape_case(dt, 64, 128, 64, 64, 2, 2, 2), 6);
  }
}

TEST(CudaBackward, ValueDimDiffersFromHeadDim) {
  SKIP_WITHOUT_GPU();
  check_backward(shape_case(DType::kFloat16, 113, 239, 128, 64, 4, 2), 11);
  check_backward(shape_case(DType::kBFloat16, 239, 113, 64, 128, 4, 1), 12);
  check_backward(shape_case(DType::kFloat16, 17, 239, 40, 256, 8, 2), 13);
  check_backward(shape_case(DType::kBFloat16, 33, 65, 160, 40, 2, 2), 14);
  check_backward(shape_case(DType::kFloat16, 40, 41, 200, 72, 2, 1), 15);
}

// Head dims that are not multiples of 8 take the element-wise load path.
TEST(CudaBackward, HeadDimsNotMultipleOf8) {
  SKIP_WITHOUT_GPU();
  check_backward(shape_case(DType::kFloat16, 17, 113, 1, 1, 2, 1), 21);
  check_backward(shape_case(DType::kBFloat16, 113, 17, 3, 5, 4, 1), 22);
  check_backward(shape_case(DType::kFloat16, 65, 70, 100, 36, 4, 2), 23);
}

TEST(CudaBackward, StridedLayoutsScaleAndNoDlse) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 113, 239, 64, 64, 4, 2, 2);
  c.q_layout.order = {0, 2, 1, 3};  // q and dout stored [B, H, L, D]
  c.kv_layout.pad = 8;
  c.grad_layout.pad = 8;
  check_backward(c, 31);
  c.kv_layout.pad = 3;  // unaligned rows: element-wise loads
  c.grad_layout.pad = 1;
  c.options.scale = 0.3f;
  c.dlse = false;
  c.dtype = DType::kBFloat16;
  check_backward(c, 32);
}

TEST(CudaBackward, CausalBothAlignments) {
  SKIP_WITHOUT_GPU();
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight})
    for (auto [lq, lk] : {std::pair<int, int>{113, 239}, {239, 113}, {128, 128}, {1, 239}}) {
      BackwardCase c = shape_case(DType::kFloat16, lq, lk, 64, 64, 8, 2);
      c.options.causal = true;
      c.options.causal_alignment = align;
      check_backward(c, 51);
    }
  BackwardCase c = shape_case(DType::kBFloat16, 239, 239, 128, 128, 4, 1);
  c.options.causal = true;
  check_backward(c, 52);
}

TEST(CudaBackward, WindowsAndFullyMaskedRows) {
  SKIP_WITHOUT_GPU();
  struct W {
    std::int64_t left, right;
    bool causal;
  };
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight})
    for (W w :
         {W{16, 0, false}, W{-1, 5, false}, W{3, 7, true}, W{100, -1, false}, W{0, 0, false}}) {
      BackwardCase c = shape_case(DType::kFloat16, 239, 113, 96, 96, 4, 2);
      c.options.window_left = w.left;
      c.options.window_right = w.right;
      c.options.causal = w.causal;
      c.options.causal_alignment = align;
      check_backward(c, 61);  // bottom-right with Lq > Lk leaves the first rows fully masked
    }
  // Lk = 0: every row fully masked, dq = 0; Lq = 0: dk = dv = 0.
  check_backward(shape_case(DType::kBFloat16, 17, 0, 64, 64, 2, 1), 62);
  check_backward(shape_case(DType::kFloat16, 0, 17, 64, 64, 2, 1), 63);
}

// Head dims above 128: on sm90 the dK/dV columns run in chunks of 128 (one kernel per chunk) with
// 32-row tiles; masks, GQA, Dv != D and the deterministic path across those chunks.
TEST(CudaBackward, WideHeadsWithMasksAndGqa) {
  SKIP_WITHOUT_GPU();
  for (auto [d, dv] : {std::pair<int, int>{192, 192}, {256, 128}, {144, 256}, {256, 256}}) {
    BackwardCase c = shape_case(DType::kBFloat16, 239, 177, d, dv, 8, 2, 2);
    c.options.causal = true;
    c.options.causal_alignment = CausalAlignment::kBottomRight;
    check_backward(c, 65);
    c.options.causal = false;
    c.options.window_left = 37;
    c.options.window_right = 11;
    c.sinks = true;
    c.dtype = DType::kFloat16;
    check_backward(c, 66);
  }
  BackwardCase c = shape_case(DType::kBFloat16, 130, 301, 256, 256, 4, 1);
  c.options.causal = true;
  c.options.deterministic = true;
  check_backward(c, 67, /*twice=*/true);
}

TEST(CudaBackward, Softcap) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 113, 239, 80, 80, 4, 1);
  c.options.softcap = 5.0f;
  c.options.scale = 2.0f;  // large scores so that the cap bends them
  check_backward(c, 71);
  c.options.causal = true;
  c.dtype = DType::kBFloat16;
  check_backward(c, 72);
}

TEST(CudaBackward, SinksAndExtraKeys) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 113, 239, 64, 64, 4, 2, 2);
  c.sinks = true;
  check_backward(c, 81);
  c.extra = 5;
  check_backward(c, 82);
  c.extra = 70;  // more than one key tile of extra keys
  c.options.causal = true;
  c.options.softcap = 8.0f;
  c.head_dim = c.value_dim = 200;  // two column chunks
  check_backward(c, 83);
  // Fully masked rows with sinks (P_sink = 1) and with extra keys (only those are seen).
  BackwardCase m = shape_case(DType::kBFloat16, 77, 30, 40, 40, 2, 1);
  m.options.causal = true;
  m.options.causal_alignment = CausalAlignment::kBottomRight;
  m.sinks = true;
  check_backward(m, 84);
  m.extra = 3;
  check_backward(m, 85);
}

TEST(CudaBackward, BiasAndItsGradient) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 113, 239, 64, 64, 4, 2, 2);
  c.bias = true;
  c.options.causal = true;
  check_backward(c, 91);  // bias read, no dbias
  c.dbias = true;
  check_backward(c, 92);
  c.bias_broadcast = {true, false, true, false};  // [1, H, 1, Lk]: dbias sums over B and Lq
  check_backward(c, 93);
  c.bias_broadcast = {false, true, false, true};  // sums over H and Lk
  c.options.softcap = 10.0f;
  c.dtype = DType::kBFloat16;
  check_backward(c, 94);
}

TEST(CudaBackward, RelativePositionSam) {
  SKIP_WITHOUT_GPU();
  // SAM-like: a 14 x 14 key grid, D = 80, with and without an additive bias on top.
  BackwardCase c = shape_case(DType::kFloat16, 196, 196, 80, 80, 2, 2);
  c.rel_hk = 14;
  c.drel = true;
  check_backward(c, 101);
  c.bias = true;
  c.dbias = true;
  c.dtype = DType::kBFloat16;
  check_backward(c, 102);
  BackwardCase r = shape_case(DType::kFloat16, 17, 15 * 7, 64, 64, 2, 1);  // Hk 15, Wk 7
  r.rel_hk = 15;
  r.drel = true;
  check_backward(r, 103);
  // Above D 128 the sm80 dK/dV kernel runs two column chunks that both recompute dS: the atomic
  // sums into drel and a broadcast dbias must come from one of them only.
  BackwardCase w = shape_case(DType::kBFloat16, 77, 12 * 10, 200, 160, 2, 1);
  w.rel_hk = 12;
  w.drel = true;
  w.bias = true;
  w.dbias = true;
  w.bias_broadcast = {true, false, false, false};  // [1, H, Lq, Lk]: dbias sums over B
  w.batch = 2;
  check_backward(w, 104);
}

// Rel-pos alone on a power-of-two grid width dividing the key tiles: on sm90 the split kernels
// with PolicyRelPos (drel_h / drel_w summed per query row in the dQ kernel, no atomics, hence
// deterministic); other widths and head dims fall back to the sm80 kernels.
TEST(CudaBackward, RelativePositionPowerOfTwoGrid) {
  SKIP_WITHOUT_GPU();
  struct Grid {
    std::int64_t lq, hk, wk, d;
  };
  std::uint64_t seed = 104;
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (Grid g : {Grid{300, 16, 16, 64}, Grid{129, 5, 64, 80}, Grid{77, 3, 128, 32},
                   Grid{65, 8, 8, 40}, Grid{90, 2, 128, 80}}) {
      BackwardCase c = shape_case(dt, g.lq, g.hk * g.wk, g.d, g.d, 4, 2, 2);
      c.rel_hk = g.hk;
      c.drel = true;
      check_backward(c, seed++);
    }
  BackwardCase c = shape_case(DType::kBFloat16, 200, 4 * 64, 64, 64, 6, 1, 2);
  c.rel_hk = 4;
  c.drel = true;
  c.options.deterministic = true;
  // The sm80 kernels (before Hopper, or FMHA_CUDA_KERNELS=sm80) sum drel with atomics: they
  // refuse; the sm90 ones must give bitwise-equal gradients twice.
  int device = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  const char* kernels = std::getenv("FMHA_CUDA_KERNELS");
  if (major == 9 && (kernels == nullptr || std::string(kernels) != "sm80")) {
    check_backward(c, seed, /*twice=*/true);
  } else {
    std::mt19937_64 rng(seed);
    Tensors t = make_tensors(c, c.dtype, DType::kFloat32, &rng);
    DeviceTensors dev;
    dev.upload(t);
    if (::testing::Test::HasFatalFailure()) return;
    const fmha::Status s = run_backward(c, dev.views(), BackwardImpl::kAuto);
    EXPECT_EQ(s.code(), fmha::StatusCode::kNotSupported);
    EXPECT_NE(s.message().find("deterministic=true with grads.drel_h"), std::string::npos)
        << s.message();
  }
}

TEST(CudaBackward, Varlen) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 0, 0, 64, 64, 4, 2);
  c.varlen_q = {17, 0, 113, 64, 1};
  c.varlen_k = {33, 5, 113, 0, 70};
  check_backward(c, 111);
  c.options.causal = true;
  c.options.causal_alignment = CausalAlignment::kBottomRight;
  c.sinks = true;
  c.extra = 3;
  c.bias = true;
  c.dbias = true;
  c.dtype = DType::kBFloat16;
  check_backward(c, 112);
}

TEST(CudaBackward, DeterministicRunTwice) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kBFloat16, 239, 577, 128, 128, 8, 2);
  c.options.causal = true;
  c.options.deterministic = true;
  c.sinks = true;
  c.extra = 5;
  c.bias = true;
  c.dbias = true;                                         // full size: one contribution per element
  c.impls = {BackwardImpl::kAuto, BackwardImpl::kFused};  // deterministic overrides fused
  check_backward(c, 121, /*twice=*/true);
}

// fp32 (tf32 tensor cores, 3xTF32 split): every gradient within norm-wise 1e-5 of the float64
// reference, fused and split, every head-dim bucket and the features of the 16-bit kernels.
TEST(CudaBackward, Float32ShapesAndHeadDims) {
  SKIP_WITHOUT_GPU();
  const DType f = DType::kFloat32;
  check_backward(shape_case(f, 1, 1, 8, 8, 2, 1), 201);
  check_backward(shape_case(f, 17, 113, 40, 40, 8, 2), 202);
  check_backward(shape_case(f, 113, 17, 80, 80, 4, 1, 2), 203);
  check_backward(shape_case(f, 239, 113, 128, 128, 8, 2), 204);
  check_backward(shape_case(f, 64, 128, 32, 32, 2, 2, 2), 205);
  check_backward(shape_case(f, 113, 239, 160, 160, 2, 1), 206);
  check_backward(shape_case(f, 40, 41, 200, 72, 2, 1), 207);
  check_backward(shape_case(f, 113, 239, 224, 224, 2, 1), 208);
  check_backward(shape_case(f, 113, 239, 256, 256, 4, 1), 209);
  check_backward(shape_case(f, 113, 239, 128, 64, 4, 2), 210);  // Dv != D
  check_backward(shape_case(f, 113, 17, 3, 5, 4, 1), 211);      // element-wise loads
  check_backward(shape_case(f, 65, 70, 100, 36, 4, 2), 212);
}

TEST(CudaBackward, Float32Features) {
  SKIP_WITHOUT_GPU();
  const DType f = DType::kFloat32;
  BackwardCase l = shape_case(f, 113, 239, 64, 64, 4, 2, 2);
  l.q_layout.order = {0, 2, 1, 3};
  l.kv_layout.pad = 3;  // unaligned rows
  l.grad_layout.pad = 1;
  l.dlse = false;
  check_backward(l, 221);
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
    BackwardCase m = shape_case(f, 239, 113, 96, 96, 4, 2);
    m.options.causal = true;
    m.options.window_left = 16;
    m.options.causal_alignment = align;
    check_backward(m, 222);
  }
  BackwardCase s = shape_case(f, 113, 239, 80, 80, 4, 1);
  s.options.softcap = 5.0f;
  s.options.scale = 2.0f;
  s.sinks = true;
  s.extra = 70;
  check_backward(s, 223);
  BackwardCase b = shape_case(f, 113, 239, 64, 64, 4, 2, 2);
  b.bias = true;
  b.dbias = true;
  b.options.causal = true;
  check_backward(b, 224);
  b.bias_broadcast = {true, false, true, false};  // dbias sums over B and Lq
  check_backward(b, 225);
  BackwardCase r = shape_case(f, 196, 196, 80, 80, 2, 2);
  r.rel_hk = 14;
  r.drel = true;
  check_backward(r, 226);
  BackwardCase v = shape_case(f, 0, 0, 64, 64, 4, 2);
  v.varlen_q = {17, 0, 113, 64, 1};
  v.varlen_k = {33, 5, 113, 0, 70};
  v.options.causal = true;
  v.options.causal_alignment = CausalAlignment::kBottomRight;
  v.sinks = true;
  v.extra = 3;
  v.bias = true;
  v.dbias = true;
  check_backward(v, 227);
  check_backward(shape_case(f, 17, 0, 64, 64, 2, 1), 228);  // every row fully masked
}

TEST(CudaBackward, Float32AllowTf32AndDeterminism) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat32, 239, 577, 64, 64, 4, 2);
  c.options.allow_tf32 = true;  // one tf32 product: SPEC §13 bound 2e-3
  check_backward(c, 231);
  BackwardCase d = shape_case(DType::kFloat32, 239, 577, 128, 128, 8, 2);
  d.options.causal = true;
  d.options.deterministic = true;
  d.sinks = true;
  d.extra = 5;
  d.bias = true;
  d.dbias = true;
  d.impls = {BackwardImpl::kAuto};
  check_backward(d, 232, /*twice=*/true);
}

TEST(CudaBackward, RefusesDeterministicBroadcastBiasGradient) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 17, 17, 64, 64, 2, 1, 2);
  c.bias = true;
  c.dbias = true;
  c.bias_broadcast = {true, false, false, false};
  c.options.deterministic = true;
  std::mt19937_64 rng(5);
  Tensors t = make_tensors(c, c.dtype, DType::kFloat32, &rng);
  DeviceTensors dev;
  dev.upload(t);
  if (::testing::Test::HasFatalFailure()) return;
  const fmha::Status s = run_backward(c, dev.views(), BackwardImpl::kAuto);
  EXPECT_EQ(s.code(), fmha::StatusCode::kNotSupported);
  EXPECT_NE(s.message().find("CUDA backward does not support deterministic=true with grads.dbias"),
            std::string::npos)
      << s.message();
}

}  // namespace
