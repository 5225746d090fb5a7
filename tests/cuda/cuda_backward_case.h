// The CUDA backward (sm80 mma.sync kernels, fused and split) against the CPU reference: the CUDA
// forward makes out and lse on the GPU, the CUDA backward turns dout (and dlse) into every
// gradient, and each gradient is compared with fmha::run of the backward on float64 CPU copies
// (the forward recomputed in float64 too) within SPEC §13's bound: 2 x the error of the naive
// same-dtype computation (tests/naive with S, P, dP, dS rounded to the dtype) + 1e-4, plus the
// error of merely storing the exact gradient in its dtype. Outputs are poisoned with NaN first, and
// the padding of padded gradient views must keep the poison (no write outside a view).
//
// This file: the case description and its check, shared by the backward test files.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fmha/fmha.h"
#include "test_util.h"

namespace fmha_cuda_test {

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
  std::int64_t bias_pad = 0;  // extra elements after every bias (and dbias) row
  std::int64_t rel_hk = 0;  // > 0: rel_h / rel_w over a key grid Hk x (Lk / Hk)
  bool drel = false;        // request drel_h / drel_w
  Layout q_layout, kv_layout, grad_layout;
  std::vector<BackwardImpl> impls{BackwardImpl::kFused, BackwardImpl::kSplit};
  fmha::Workspace workspace;  // the scratch memory of its calls (default: the library's pool)

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

// Every tensor of one problem, host side. Gradients and forward outputs share the names of the
// library's parameters.
struct Tensors {
  HostTensor q, k, v, out, lse, dout, dlse, sinks, extra_k, extra_v, bias, rel_h, rel_w, cu_q, cu_k;
  HostTensor dq, dk, dv, dsinks, dextra_k, dextra_v, dbias, drel_h, drel_w;
};

// The views handed to fmha::run, from host tensors or their device copies.
struct Views {
  fmha::TensorView q, k, v, out, lse, dout, dlse, sinks, extra_k, extra_v, bias, rel_h, rel_w;
  fmha::TensorView cu_q, cu_k, dq, dk, dv, dsinks, dextra_k, dextra_v, dbias, drel_h, drel_w;
};

// Device copies of a case's tensors (same strides), freed with the object.
class DeviceTensors {
 public:
  ~DeviceTensors();
  void upload(Tensors& t);
  // Host contents -> device for one tensor already uploaded (re-poisoning between runs).
  void reset(HostTensor& h, const fmha::TensorView& dv);
  void download(HostTensor& h, const fmha::TensorView& dv);
  const Views& views() const { return views_; }

 private:
  std::vector<void*> allocations_;
  Views views_;
};

// True when a CUDA device is present; tests GTEST_SKIP otherwise (cuda_forward_case.cpp).
bool gpu_available();

// Allocates every tensor in `dtype` (statistics in `stat`), random inputs, NaN-poisoned outputs.
Tensors make_tensors(const BackwardCase& c, DType dtype, DType stat, std::mt19937_64* rng);

// The case's forward on views `v` (out and lse), on the default stream, and the scratch bytes it
// takes (fmha::workspace_size).
fmha::Status run_forward(const BackwardCase& c, const Views& v);
fmha::Status forward_workspace_size(const BackwardCase& c, const Views& v, std::size_t* bytes);

// The case's backward on views `v` with one implementation, on `stream` (the default one unless
// given), and the scratch bytes it takes.
fmha::Status run_backward(const BackwardCase& c, const Views& v, BackwardImpl impl,
                          void* stream = nullptr);
fmha::Status backward_workspace_size(const BackwardCase& c, const Views& v, BackwardImpl impl,
                                     std::size_t* bytes);

// Runs the case's forward and backward on the GPU, once per implementation in c.impls, and checks
// every gradient; with `twice`, runs each implementation again and requires identical bits.
void check_backward(const BackwardCase& c, std::uint64_t seed, bool twice = false);

// Runs the case's forward, then per implementation in c.impls its backward on a stream of its own
// with a device-to-device copy of dq, dk and dv queued on that stream right behind it, and
// requires each copy to hold the gradient read after the stream has drained, bit for bit, and no
// poisoned element: work queued behind the backward sees its gradients complete, whatever kernels
// the backward overlapped inside.
void check_gradients_queued_behind(const BackwardCase& c, std::uint64_t seed);

// A dense case of these sizes, everything else default.
BackwardCase shape_case(DType dtype, std::int64_t lq, std::int64_t lk, std::int64_t d,
                        std::int64_t dv, std::int64_t h, std::int64_t hkv, std::int64_t b = 1);

}  // namespace fmha_cuda_test
