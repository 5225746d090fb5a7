#include "cuda/cuda_forward_case.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <utility>

#include "cuda/cuda_case_util.h"
#include "cuda/cuda_device_copy.h"
#include "naive/naive_masks.h"
#include "naive/naive_problem.h"

namespace fmha_cuda_test {
namespace {

using fmha_test::HostTensor;

struct Tensors {
  HostTensor q, k, v, out, lse, bias, rel_h, rel_w, sinks, extra_k, extra_v, cu_q, cu_k;
};
struct Views {
  fmha::TensorView q, k, v, out, lse, bias, rel_h, rel_w, sinks, extra_k, extra_v, cu_q, cu_k;
};
constexpr std::pair<HostTensor Tensors::*, fmha::TensorView Views::*> kMembers[] = {
    {&Tensors::q, &Views::q},
    {&Tensors::k, &Views::k},
    {&Tensors::v, &Views::v},
    {&Tensors::out, &Views::out},
    {&Tensors::lse, &Views::lse},
    {&Tensors::bias, &Views::bias},
    {&Tensors::rel_h, &Views::rel_h},
    {&Tensors::rel_w, &Views::rel_w},
    {&Tensors::sinks, &Views::sinks},
    {&Tensors::extra_k, &Views::extra_k},
    {&Tensors::extra_v, &Views::extra_v},
    {&Tensors::cu_q, &Views::cu_q},
    {&Tensors::cu_k, &Views::cu_k}};

std::int64_t num_batches(const ForwardCase& c) {
  return c.varlen() ? static_cast<std::int64_t>(c.varlen_q.size()) : c.batch;
}
std::int64_t rows_q(const ForwardCase& c) {
  return c.varlen() ? longest(c.varlen_q) : c.seqlen_q;
}
std::int64_t rows_k(const ForwardCase& c) {
  return c.varlen() ? longest(c.varlen_k) : c.seqlen_k;
}

Tensors make_tensors(const ForwardCase& c, std::mt19937_64& rng) {
  const std::int64_t b = num_batches(c), h = c.heads, hkv = c.kv_heads;
  const std::int64_t d = c.head_dim, dv = c.value_dim;
  Tensors t;
  if (c.varlen()) {
    const std::int64_t tq = total(c.varlen_q), tk = total(c.varlen_k);
    t.q = HostTensor(c.dtype, {tq, h, d}, c.q_layout);
    t.k = HostTensor(c.dtype, {tk, hkv, d}, c.kv_layout);
    t.v = HostTensor(c.dtype, {tk, hkv, dv}, c.kv_layout);
    t.out = HostTensor(c.dtype, {tq, h, dv}, c.out_layout);
    if (c.lse) t.lse = HostTensor(DType::kFloat32, {h, tq});
    t.cu_q = cu_seqlens(c.varlen_q);
    t.cu_k = cu_seqlens(c.varlen_k);
  } else {
    t.q = HostTensor(c.dtype, {b, c.seqlen_q, h, d}, c.q_layout);
    t.k = HostTensor(c.dtype, {b, c.seqlen_k, hkv, d}, c.kv_layout);
    t.v = HostTensor(c.dtype, {b, c.seqlen_k, hkv, dv}, c.kv_layout);
    t.out = HostTensor(c.dtype, {b, c.seqlen_q, h, dv}, c.out_layout);
    if (c.lse) t.lse = HostTensor(DType::kFloat32, {b, h, c.seqlen_q});
  }
  t.q.fill_uniform(rng, -1, 1);
  t.k.fill_uniform(rng, -1, 1);
  t.v.fill_uniform(rng, -1, 1);
  if (c.bias) {
    Layout layout;
    std::vector<std::int64_t> shape{b, h, rows_q(c), rows_k(c)};
    for (std::size_t d = 0; d < 4; ++d) {
      if (c.bias_broadcast[d] && c.bias_size_one) shape[d] = 1;
    }
    if (!c.bias_size_one) layout.broadcast.assign(c.bias_broadcast.begin(), c.bias_broadcast.end());
    layout.pad = c.bias_pad;
    t.bias = HostTensor(c.dtype, shape, layout);
    t.bias.fill_uniform(rng, -2, 2);
  }
  if (c.rel_hk > 0) {
    t.rel_h = HostTensor(c.dtype, {b, h, rows_q(c), c.rel_hk});
    t.rel_w = HostTensor(c.dtype, {b, h, rows_q(c), rows_k(c) / c.rel_hk});
    t.rel_h.fill_uniform(rng, -1, 1);
    t.rel_w.fill_uniform(rng, -1, 1);
  }
  if (c.sinks) {
    t.sinks = HostTensor(DType::kFloat32, {h});
    t.sinks.fill_uniform(rng, -1, 2);
  }
  if (c.extra > 0) {
    t.extra_k = HostTensor(c.dtype, {b, c.extra, hkv, d});
    t.extra_v = HostTensor(c.dtype, {b, c.extra, hkv, dv});
    t.extra_k.fill_uniform(rng, -1, 1);
    t.extra_v.fill_uniform(rng, -1, 1);
  }
  return t;
}

// Float64 copies of every floating input and output (sinks and cu_seqlens stay as they are).
Tensors float64_copies(const Tensors& t) {
  Tensors r;
  for (const auto& [member, view] : kMembers) {
    (void)view;
    const HostTensor& src = t.*member;
    if (!src.defined()) continue;
    if (member == &Tensors::sinks || member == &Tensors::cu_q || member == &Tensors::cu_k) {
      r.*member = src;
      continue;
    }
    r.*member = HostTensor(DType::kFloat64, src.shape());
    (r.*member).from_double(src.to_double());
  }
  return r;
}

fmha::Status run_views(const ForwardCase& c, const Views& v, void* stream) {
  fmha::AttentionOptions o = c.options;
  o.bias = v.bias;
  o.rel_h = v.rel_h;
  o.rel_w = v.rel_w;
  o.sinks = v.sinks;
  o.extra_k = v.extra_k;
  o.extra_v = v.extra_v;
  if (c.varlen()) {
    fmha::VarlenForwardParams p{.q = v.q,
                                .k = v.k,
                                .v = v.v,
                                .cu_seqlens_q = v.cu_q,
                                .cu_seqlens_k = v.cu_k,
                                .max_seqlen_q = rows_q(c),
                                .max_seqlen_k = rows_k(c),
                                .out = v.out,
                                .lse = v.lse,
                                .options = o};
    return fmha::run(p, stream);
  }
  fmha::AttentionForwardParams p{
      .q = v.q, .k = v.k, .v = v.v, .out = v.out, .lse = v.lse, .options = o};
  return fmha::run(p, stream);
}

Views host_views(Tensors& t) {
  Views v;
  for (const auto& [member, view] : kMembers) v.*view = (t.*member).view();
  return v;
}

// Bytes spanned by a strided view (its storage, as HostTensor allocates it).
std::size_t storage_bytes(const fmha::TensorView& v) {
  std::int64_t elements = 1;
  for (int d = 0; d < v.rank; ++d) {
    if (v.shape[static_cast<std::size_t>(d)] == 0) return 0;
    elements += (v.shape[static_cast<std::size_t>(d)] - 1) * v.stride[static_cast<std::size_t>(d)];
  }
  return static_cast<std::size_t>(elements) * fmha::element_size(v.dtype);
}

// Device copies of every defined tensor, with the host's strides.
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
      if (bytes > 0) CUDA_CHECK(fmha_cuda_test::copy_to_device(p, dv.data, bytes));
      dv.data = p;
      dv.device = fmha::Device::cuda(0);
      views_.*view = dv;
    }
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

// The bias's values over the full [B, H, Lq, Lk] grid (size-1 dimensions repeated).
std::vector<double> expand_bias(const HostTensor& bias, const std::vector<std::int64_t>& full) {
  const std::vector<double> values = bias.to_double();
  std::vector<double> r(static_cast<std::size_t>(fmha_test::product(full)));
  for (std::int64_t index = 0; index < static_cast<std::int64_t>(r.size()); ++index) {
    const std::vector<std::int64_t> at = fmha_test::unravel(index, full);
    std::int64_t source = 0;
    for (std::size_t d = 0; d < 4; ++d) {
      source = source * bias.shape()[d] + (bias.shape()[d] == 1 ? 0 : at[d]);
    }
    r[static_cast<std::size_t>(index)] = values[static_cast<std::size_t>(source)];
  }
  return r;
}

double round_fp16(double x) {
  return fmha_test::round_to(DType::kFloat16, x);
}
double round_bf16(double x) {
  return fmha_test::round_to(DType::kBFloat16, x);
}

// The naive same-dtype computation (S, P and out rounded to the dtype) of SPEC §13's bound.
naive::Forward naive_low_precision(const ForwardCase& c, const Tensors& t) {
  naive::Problem p;
  p.heads = c.heads;
  p.kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.value_dim = c.value_dim;
  p.batch = num_batches(c);
  p.rows_q = t.q.shape()[0] * (c.varlen() ? 1 : c.seqlen_q);
  p.rows_k = t.k.shape()[0] * (c.varlen() ? 1 : c.seqlen_k);
  std::int64_t q0 = 0, k0 = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = c.varlen() ? c.varlen_q[static_cast<std::size_t>(b)] : c.seqlen_q;
    const std::int64_t lk = c.varlen() ? c.varlen_k[static_cast<std::size_t>(b)] : c.seqlen_k;
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
  p.bias_rows = rows_q(c);
  p.bias_cols = rows_k(c);
  if (c.bias) p.bias = expand_bias(t.bias, {p.batch, c.heads, p.bias_rows, p.bias_cols});
  if (c.rel_hk > 0) {
    p.rel_h = t.rel_h.to_double();
    p.rel_w = t.rel_w.to_double();
    p.rel_hk = c.rel_hk;
    p.rel_wk = rows_k(c) / c.rel_hk;
  }
  if (c.sinks) p.sinks = t.sinks.to_double();
  p.scale = c.options.scale ? *c.options.scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  p.softcap = c.options.softcap;
  const fmha::AttentionOptions o = c.options;
  p.mask = [o](const naive::Segment& s) {
    return naive::attention_mask(s.q_len, s.k_len, o.causal,
                                 o.causal_alignment == fmha::CausalAlignment::kBottomRight,
                                 o.window_left, o.window_right);
  };
  return naive::forward(p, c.dtype == DType::kFloat16 ? round_fp16 : round_bf16);
}

// naive lse [rows_q, H] -> the library's [B, H, Lq] (dense) or [H, total_q] (varlen).
std::vector<double> lse_to_library(const ForwardCase& c, const std::vector<double>& naive_lse) {
  std::vector<double> r(naive_lse.size());
  const std::int64_t h = c.heads;
  const std::int64_t rows = static_cast<std::int64_t>(naive_lse.size()) / h;
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t hh = 0; hh < h; ++hh) {
      std::int64_t lib;
      if (c.varlen()) {
        lib = hh * rows + row;
      } else {
        const std::int64_t b = row / c.seqlen_q, i = row % c.seqlen_q;
        lib = (b * h + hh) * c.seqlen_q + i;
      }
      r[static_cast<std::size_t>(lib)] = naive_lse[static_cast<std::size_t>(row * h + hh)];
    }
  return r;
}

void report(const char* name, const ForwardCase& c, const std::vector<double>& got,
            const std::vector<double>& ref, double tol) {
  const fmha_test::ErrorStats st = fmha_test::compare(got, ref, tol);
  std::printf("[ errors ] %-4s rel %.3e  bound %.3e  max_abs %.3e  | %s\n", name, st.rel_error, tol,
              st.max_abs, c.describe().c_str());
}

}  // namespace

std::string ForwardCase::describe() const {
  std::ostringstream s;
  describe_problem(s, dtype, varlen_q, varlen_k, batch, seqlen_q, seqlen_k, heads, kv_heads,
                   head_dim, value_dim, options);
  if (bias) {
    s << " bias";
    for (bool x : bias_broadcast) s << (x ? (bias_size_one ? '1' : '0') : '.');
    if (bias_pad > 0) s << " pad " << bias_pad;
  }
  if (rel_hk > 0) s << " relpos" << rel_hk;
  if (sinks) s << " sinks";
  if (extra > 0) s << " extra" << extra;
  if (!q_layout.order.empty() || q_layout.pad) s << " q-strided";
  if (!kv_layout.order.empty() || kv_layout.pad || !kv_layout.broadcast.empty()) s << " kv-strided";
  if (out_layout.pad) s << " out-padded";
  return s.str();
}

bool gpu_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::size_t free_device_memory() {
  std::size_t free = 0, total = 0;
  return cudaMemGetInfo(&free, &total) == cudaSuccess ? free : 0;
}

fmha::Status run_forward_status(const ForwardCase& c) {
  std::mt19937_64 rng(7);
  Tensors t = make_tensors(c, rng);
  DeviceTensors dev;
  dev.upload(t);
  const fmha::Status s = run_views(c, dev.views(), nullptr);
  cudaDeviceSynchronize();
  return s;
}

void check_forward(const ForwardCase& c, std::uint64_t seed, bool twice) {
  SCOPED_TRACE("case: " + c.describe() + " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Tensors t = make_tensors(c, rng);

  // Reference: the CPU backend on float64 copies.
  Tensors ref = float64_copies(t);
  const fmha::Status rs = run_views(c, host_views(ref), nullptr);
  ASSERT_TRUE(rs.ok()) << "CPU reference refused: " << rs.message();

  t.out.poison();
  if (c.lse) t.lse.poison();
  DeviceTensors dev;
  dev.upload(t);
  if (::testing::Test::HasFatalFailure()) return;
  // A stream of its own that does not synchronise with the legacy default stream.
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const fmha::Status gs = run_views(c, dev.views(), stream);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  ASSERT_TRUE(gs.ok()) << "CUDA forward refused: " << gs.message();
  CUDA_CHECK(synced);
  dev.download(t.out, dev.views().out);
  if (c.lse) dev.download(t.lse, dev.views().lse);
  // The padding around the views (padded out rows) still holds the poison.
  EXPECT_EQ(t.out.padding_report(), "") << "out: an element outside the view was written";
  if (c.lse) {
    EXPECT_EQ(t.lse.padding_report(), "") << "lse: an element outside the view was written";
  }

  // fp32 has fixed bounds (SPEC §13: 1e-5, 2e-3 with allow_tf32); 16-bit dtypes are bounded by
  // the naive same-dtype computation.
  const bool fp32 = c.dtype == DType::kFloat32;
  const double fp32_tol = c.options.allow_tf32 ? 2e-3 : 1e-5;
  const naive::Forward lowp = fp32 ? naive::Forward{} : naive_low_precision(c, t);
  const std::vector<double> ref_out = ref.out.to_double();
  const double out_tol =
      fp32 ? fp32_tol : fmha_test::tolerance(c.dtype, ref_out, lowp.out, c.dtype);
  const std::vector<double> got_out = t.out.to_double();
  report("out", c, got_out, ref_out, out_tol);
  EXPECT_TRUE(fmha_test::close("out", got_out, ref_out, t.out.shape(), out_tol));
  if (c.lse) {
    const std::vector<double> ref_lse = ref.lse.to_double();
    const double lse_tol =
        fp32 ? fp32_tol
             : fmha_test::tolerance(c.dtype, ref_lse, lse_to_library(c, lowp.lse), DType::kFloat32);
    const std::vector<double> got_lse = t.lse.to_double();
    report("lse", c, got_lse, ref_lse, lse_tol);
    EXPECT_TRUE(fmha_test::close("lse", got_lse, ref_lse, t.lse.shape(), lse_tol));
  }

  if (twice) {
    HostTensor first_out = t.out, first_lse = t.lse;
    t.out.poison();
    if (c.lse) t.lse.poison();
    DeviceTensors dev2;
    dev2.upload(t);
    if (::testing::Test::HasFatalFailure()) return;
    const fmha::Status s2 = run_views(c, dev2.views(), nullptr);
    ASSERT_TRUE(s2.ok()) << s2.message();
    CUDA_CHECK(cudaDeviceSynchronize());
    dev2.download(t.out, dev2.views().out);
    if (c.lse) dev2.download(t.lse, dev2.views().lse);
    EXPECT_TRUE(t.out.bitwise_equal(first_out)) << "out differs between two identical runs";
    if (c.lse) {
      EXPECT_TRUE(t.lse.bitwise_equal(first_lse)) << "lse differs between two runs";
    }
  }
}

}  // namespace fmha_cuda_test
