// The backward test case (cuda_backward_case.h): tensors, device copies, runs and the check.
#include "cuda_backward_case.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "cuda/cuda_case_util.h"
#include "cuda/cuda_device_copy.h"
#include "naive/naive_masks.h"
#include "naive/naive_problem.h"

namespace fmha_cuda_test {

std::string BackwardCase::describe() const {
  std::ostringstream s;
  describe_problem(s, dtype, varlen_q, varlen_k, batch, seqlen_q, seqlen_k, heads, kv_heads,
                   head_dim, value_dim, options);
  if (!dlse) s << " no-dlse";
  if (sinks) s << " sinks";
  if (extra > 0) s << " extra" << extra;
  if (bias) {
    s << (dbias ? " dbias" : " bias");
    for (bool x : bias_broadcast) s << (x ? '0' : '.');
    if (bias_pad > 0) s << " pad " << bias_pad;
  }
  if (rel_hk > 0) s << (drel ? " drel" : " relpos") << rel_hk;
  if (!q_layout.order.empty() || q_layout.pad) s << " q-strided";
  if (kv_layout.pad || !kv_layout.broadcast.empty()) s << " kv-strided";
  if (grad_layout.pad) s << " grads-padded";
  return s.str();
}

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
    layout.pad = c.bias_pad;
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

namespace {

void copy_values(const HostTensor& from, HostTensor* to) {
  if (from.defined()) to->from_double(from.to_double());
}

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

}  // namespace

DeviceTensors::~DeviceTensors() {
  for (void* p : allocations_) cudaFree(p);
}

void DeviceTensors::upload(Tensors& t) {
  for (const auto& [member, view] : kMembers) {
    HostTensor& h = t.*member;
    if (!h.defined()) continue;
    fmha::TensorView dv = h.view();
    const std::size_t bytes = storage_bytes(dv);
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)));
    allocations_.push_back(p);
    if (bytes > 0) CUDA_CHECK(fmha_cuda_test::copy_to_device(p, dv.data, bytes));
    dv.data = p;
    dv.device = fmha::Device::cuda(0);
    views_.*view = dv;
  }
}

void DeviceTensors::reset(HostTensor& h, const fmha::TensorView& dv) {
  const std::size_t bytes = storage_bytes(dv);
  if (bytes > 0) CUDA_CHECK(fmha_cuda_test::copy_to_device(dv.data, h.view().data, bytes));
}

void DeviceTensors::download(HostTensor& h, const fmha::TensorView& dv) {
  const std::size_t bytes = storage_bytes(dv);
  if (bytes > 0) CUDA_CHECK(cudaMemcpy(h.view().data, dv.data, bytes, cudaMemcpyDeviceToHost));
}

namespace {

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

// Calls fn with the case's forward parameters on views `v` (dense or varlen).
template <typename Fn>
fmha::Status with_forward_params(const BackwardCase& c, const Views& v, Fn fn) {
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
                                .options = o,
                                .workspace = c.workspace};
    return fn(p);
  }
  fmha::AttentionForwardParams p{.q = v.q,
                                 .k = v.k,
                                 .v = v.v,
                                 .out = v.out,
                                 .lse = v.lse,
                                 .options = o,
                                 .workspace = c.workspace};
  return fn(p);
}

// Likewise with its backward parameters.
template <typename Fn>
fmha::Status with_backward_params(const BackwardCase& c, const Views& v, BackwardImpl impl,
                                  Fn fn) {
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
                                 .grads = g,
                                 .workspace = c.workspace};
    return fn(p);
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
                                  .grads = g,
                                  .workspace = c.workspace};
  return fn(p);
}

}  // namespace

fmha::Status run_forward(const BackwardCase& c, const Views& v) {
  return with_forward_params(c, v, [](const auto& p) { return fmha::run(p, nullptr); });
}

fmha::Status forward_workspace_size(const BackwardCase& c, const Views& v, std::size_t* bytes) {
  return with_forward_params(c, v, [&](const auto& p) { return fmha::workspace_size(p, bytes); });
}

fmha::Status run_backward(const BackwardCase& c, const Views& v, BackwardImpl impl,
                          void* stream) {
  return with_backward_params(c, v, impl, [&](const auto& p) { return fmha::run(p, stream); });
}

fmha::Status backward_workspace_size(const BackwardCase& c, const Views& v, BackwardImpl impl,
                                     std::size_t* bytes) {
  return with_backward_params(c, v, impl,
                              [&](const auto& p) { return fmha::workspace_size(p, bytes); });
}

namespace {

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

}  // namespace

void check_backward(const BackwardCase& c, std::uint64_t seed, bool twice) {
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
        EXPECT_TRUE(g.padding_untouched())
            << kGradientNames[n] << " (" << impl_name(impl)
            << "): an element outside the view was written";
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
                        std::int64_t dv, std::int64_t h, std::int64_t hkv, std::int64_t b) {
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

void check_gradients_queued_behind(const BackwardCase& c, std::uint64_t seed) {
  SCOPED_TRACE("case: " + c.describe() + " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Tensors t = make_tensors(c, c.dtype, DType::kFloat32, &rng);
  DeviceTensors dev;
  dev.upload(t);
  if (::testing::Test::HasFatalFailure()) return;
  fmha::Status s = run_forward(c, dev.views());
  ASSERT_TRUE(s.ok()) << "CUDA forward refused: " << s.message();
  constexpr int kChecked = 3;  // dq, dk, dv: the first three of kGradients
  DeviceCopies copies;         // device storage like each gradient's, for the queued copies
  fmha::TensorView queued_views[kChecked];
  for (int n = 0; n < kChecked; ++n) queued_views[n] = copies.upload(t.*kGradients[n]);
  if (::testing::Test::HasFailure()) return;
  CUDA_CHECK(cudaDeviceSynchronize());
  TestStream stream;
  const auto queue = static_cast<cudaStream_t>(stream.get());
  for (BackwardImpl impl : c.impls) {
    for (int n = 0; n < kChecked; ++n) {
      (t.*kGradients[n]).poison();
      dev.reset(t.*kGradients[n], dev.views().*kGradientViews[n]);
    }
    s = run_backward(c, dev.views(), impl, stream.get());
    ASSERT_TRUE(s.ok()) << "CUDA backward (" << impl_name(impl) << ") refused: " << s.message();
    for (int n = 0; n < kChecked; ++n) {
      const fmha::TensorView& g = dev.views().*kGradientViews[n];
      CUDA_CHECK(cudaMemcpyAsync(queued_views[n].data, g.data, storage_bytes(g),
                                 cudaMemcpyDeviceToDevice, queue));
    }
    CUDA_CHECK(stream.sync());
    for (int n = 0; n < kChecked; ++n) {
      HostTensor& final_grad = t.*kGradients[n];
      HostTensor queued = final_grad;
      dev.download(final_grad, dev.views().*kGradientViews[n]);
      DeviceCopies::download(queued, queued_views[n]);
      const std::vector<double> values = final_grad.to_double();
      EXPECT_TRUE(
          std::all_of(values.begin(), values.end(), [](double x) { return std::isfinite(x); }))
          << kGradientNames[n] << " (" << impl_name(impl) << "): a poisoned element left";
      EXPECT_TRUE(queued.bitwise_equal(final_grad))
          << kGradientNames[n] << " (" << impl_name(impl)
          << "): the copy queued behind the backward saw it incomplete";
    }
  }
}

}  // namespace fmha_cuda_test
