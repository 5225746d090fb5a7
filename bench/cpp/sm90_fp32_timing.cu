// sm90-fp32-timing: the sm90 fp32 forward and backward (tf32 wgmma on split planes,
// mainloop_fwd_fp32.cuh, mainloop_bwd_fp32.cuh) on issue 4's fp32 case (B 4, H 16, L 2048, D 64;
// plain and causal), the forward against the sm80 fp32 forward (mma.sync on tf32), each through
// its launcher on random inputs: CUDA events around each launch (the sm90 ones include their planes
// pass, into scratch memory allocated beforehand as the library's callers hand it over; the
// backward not the row statistics' preprocess, whose values here are random), the L2 flushed in
// between, the median of 50 runs. First a quick check of the sm90 kernels against a float64
// reference on small odd shapes (norm-wise relative errors of out, lse, dq, dk, dv), for iterating
// on the kernels without the library; the GPU suite is the test. Built by hand, from the source
// root, for sm_90a:
//
//   nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a \
//        -Isrc -Iinclude -o sm90-fp32-timing bench/cpp/sm90_fp32_timing.cu -lcuda
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda/sm80/launch_fwd.cuh"
#include "cuda/sm90/launch_bwd_fp32.cuh"
#include "cuda/sm90/launch_fwd_fp32.cuh"
#include "kernel_timing.h"

namespace fmha::cuda {
namespace sm80 {
template Status launch_forward<float, 64, PolicyPlain>(const ForwardParams&, cudaStream_t);
template Status launch_forward<float, 64, PolicyGeneral>(const ForwardParams&, cudaStream_t);
}  // namespace sm80
namespace sm90 {
template Status launch_forward_fp32<float, 64, PolicyPlain>(const ForwardParams&, cudaStream_t);
template Status launch_forward_fp32<float, 64, PolicyWindow>(const ForwardParams&, cudaStream_t);
template Status launch_backward_fp32<float, 64, PolicyPlain>(const BackwardParams&, cudaStream_t);
template Status launch_backward_fp32<float, 64, PolicyWindow>(const BackwardParams&,
                                                              cudaStream_t);
}  // namespace sm90
}  // namespace fmha::cuda

using fmha::cuda::BackwardParams;
using fmha::cuda::ForwardParams;

namespace {

void launch_or_exit(const fmha::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "launch failed: %s\n", s.message().c_str());
    std::exit(1);
  }
}

// The checks' inputs: n random normal floats on the host, and a host vector on the device
// (never freed before the check ends).
std::vector<float> random_host(std::size_t n, std::mt19937& gen) {
  std::normal_distribution<float> dist;
  std::vector<float> h(n);
  for (auto& x : h) x = dist(gen);
  return h;
}
void* upload(const std::vector<float>& h) {
  void* d = nullptr;
  CHECK(cudaMalloc(&d, h.size() * 4));
  CHECK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

// The launchers' scratch memory (their planes), as forward.cu / backward.cu hand it over: one
// buffer grown to the largest call's size and kept for the run.
void* scratch_of(std::size_t bytes) {
  static void* buffer = nullptr;
  static std::size_t size = 0;
  if (bytes > size) {
    if (buffer != nullptr) CHECK(cudaFree(buffer));
    CHECK(cudaMalloc(&buffer, bytes));
    size = bytes;
  }
  return buffer;
}

fmha::Status launch_sm90(ForwardParams p, bool causal) {
  using namespace fmha::cuda;
  p.scratch = scratch_of(sm90::fp32_forward_planes_floats(p) * sizeof(float));
  return causal ? sm90::launch_forward_fp32<float, 64, PolicyWindow>(p, nullptr)
                : sm90::launch_forward_fp32<float, 64, PolicyPlain>(p, nullptr);
}

// [B, L, H, D] contiguous inputs (kv heads Hkv), float64 reference of out and lse, top-left
// causal or none; prints the norm-wise relative errors of the sm90 kernel.
void check(int B, int H, int Hkv, int Lq, int Lk, int D, int Dv, bool causal) {
  std::mt19937 gen(7);
  auto fill = [&](std::size_t n) { return random_host(n, gen); };
  const auto q = fill(std::size_t(B) * Lq * H * D), k = fill(std::size_t(B) * Lk * Hkv * D),
             v = fill(std::size_t(B) * Lk * Hkv * Dv);
  ForwardParams p;
  p.q = upload(q);
  p.k = upload(k);
  p.v = upload(v);
  const std::size_t out_n = std::size_t(B) * Lq * H * Dv, lse_n = std::size_t(B) * H * Lq;
  void *out = nullptr, *lse = nullptr;
  CHECK(cudaMalloc(&out, out_n * 4));
  CHECK(cudaMalloc(&lse, lse_n * 4));
  CHECK(cudaMemset(out, 0xff, out_n * 4));  // NaN poison
  p.out = out;
  p.lse = static_cast<float*>(lse);
  p.q_row_stride = std::int64_t(H) * D, p.q_batch_stride = p.q_row_stride * Lq, p.q_head_stride = D;
  p.k_row_stride = std::int64_t(Hkv) * D, p.k_batch_stride = p.k_row_stride * Lk;
  p.k_head_stride = D;
  p.v_row_stride = std::int64_t(Hkv) * Dv, p.v_batch_stride = p.v_row_stride * Lk;
  p.v_head_stride = Dv;
  p.out_row_stride = std::int64_t(H) * Dv, p.out_batch_stride = p.out_row_stride * Lq;
  p.out_head_stride = Dv;
  p.lse_batch_stride = std::int64_t(H) * Lq, p.lse_head_stride = Lq, p.lse_row_stride = 1;
  p.batch = B, p.seqlen_q = Lq, p.seqlen_k = Lk, p.heads = H, p.kv_group = H / Hkv;
  p.head_dim = D, p.value_dim = Dv;
  const double scale = 1.0 / std::sqrt(double(D));
  p.scale_log2 = float(scale * 1.4426950408889634);
  if (causal) p.window_right = 0;
  launch_or_exit(launch_sm90(p, causal));
  std::vector<float> got(out_n), got_lse(lse_n);
  CHECK(cudaMemcpy(got.data(), out, out_n * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(got_lse.data(), lse, lse_n * 4, cudaMemcpyDeviceToHost));
  double err = 0, ref_norm = 0, lse_err = 0, lse_norm = 0;
  std::vector<double> s(Lk);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const int g = h / (H / Hkv);
      for (int i = 0; i < Lq; ++i) {
        double mx = -INFINITY;
        for (int j = 0; j < Lk; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) {
            dot += double(q[((std::size_t(b) * Lq + i) * H + h) * D + d]) *
                   k[((std::size_t(b) * Lk + j) * Hkv + g) * D + d];
          }
          s[j] = causal && j > i ? -INFINITY : dot * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < Lk; ++j) sum += s[j] == -INFINITY ? 0 : std::exp(s[j] - mx);
        const double l = mx + std::log(sum);
        const double lg = got_lse[(std::size_t(b) * H + h) * Lq + i];
        lse_err += (lg - l) * (lg - l), lse_norm += l * l;
        for (int c = 0; c < Dv; ++c) {
          double o = 0;
          for (int j = 0; j < Lk; ++j) {
            if (s[j] != -INFINITY) {
              o += std::exp(s[j] - l) * v[((std::size_t(b) * Lk + j) * Hkv + g) * Dv + c];
            }
          }
          const double x = got[((std::size_t(b) * Lq + i) * H + h) * Dv + c];
          err += (x - o) * (x - o), ref_norm += o * o;
        }
      }
    }
  }
  std::printf("check B=%d H=%d Hkv=%d Lq=%d Lk=%d D=%d Dv=%d causal=%d: out %.2e lse %.2e\n", B,
              H, Hkv, Lq, Lk, D, Dv, causal, std::sqrt(err / ref_norm),
              std::sqrt(lse_err / lse_norm));
  CHECK(cudaFree(const_cast<void*>(p.q)));
  CHECK(cudaFree(const_cast<void*>(p.k)));
  CHECK(cudaFree(const_cast<void*>(p.v)));
  CHECK(cudaFree(out));
  CHECK(cudaFree(lse));
}

fmha::Status launch_sm90_backward(BackwardParams p, bool causal) {
  using namespace fmha::cuda;
  p.fwd.scratch = scratch_of(sm90::fp32_backward_planes_floats(p.fwd) * sizeof(float));
  return causal ? sm90::launch_backward_fp32<float, 64, PolicyWindow>(p, nullptr)
                : sm90::launch_backward_fp32<float, 64, PolicyPlain>(p, nullptr);
}

// The backward on [B, L, H, D] contiguous inputs: the row statistics (lse in log2 units, Delta)
// and the gradients of a float64 reference; prints the norm-wise relative errors of dq, dk, dv.
void check_backward(int B, int H, int Hkv, int Lq, int Lk, int D, int Dv, bool causal) {
  std::mt19937 gen(11);
  auto fill = [&](std::size_t n) { return random_host(n, gen); };
  const int G = H / Hkv;
  const auto q = fill(std::size_t(B) * Lq * H * D), k = fill(std::size_t(B) * Lk * Hkv * D),
             v = fill(std::size_t(B) * Lk * Hkv * Dv), dout = fill(std::size_t(B) * Lq * H * Dv);
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
  std::vector<float> lse_log2(std::size_t(B) * H * Lq), delta(lse_log2.size());
  std::vector<double> pr(Lk), dpr(Lk);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const int g = h / G;
      for (int i = 0; i < Lq; ++i) {
        auto qi = [&](int d) { return double(q[((std::size_t(b) * Lq + i) * H + h) * D + d]); };
        auto kj = [&](int j, int d) { return double(k[((std::size_t(b) * Lk + j) * Hkv + g) * D + d]); };
        auto vj = [&](int j, int c) { return double(v[((std::size_t(b) * Lk + j) * Hkv + g) * Dv + c]); };
        auto doi = [&](int c) { return double(dout[((std::size_t(b) * Lq + i) * H + h) * Dv + c]); };
        double mx = -INFINITY;
        for (int j = 0; j < Lk; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += qi(d) * kj(j, d);
          pr[j] = causal && j > i ? -INFINITY : dot * scale;
          mx = std::max(mx, pr[j]);
        }
        double sum = 0;
        for (int j = 0; j < Lk; ++j) sum += pr[j] == -INFINITY ? 0 : std::exp(pr[j] - mx);
        const double l = mx + std::log(sum);
        double dl = 0;  // Delta = dout . out
        for (int j = 0; j < Lk; ++j) {
          pr[j] = pr[j] == -INFINITY ? 0.0 : std::exp(pr[j] - l);
          double dp = 0;
          for (int c = 0; c < Dv; ++c) dp += doi(c) * vj(j, c);
          dpr[j] = dp;
          dl += pr[j] * dp;
        }
        lse_log2[(std::size_t(b) * H + h) * Lq + i] = float(l * 1.4426950408889634);
        delta[(std::size_t(b) * H + h) * Lq + i] = float(dl);
        for (int j = 0; j < Lk; ++j) {
          const double ds = pr[j] * (dpr[j] - dl);
          for (int d = 0; d < D; ++d) {
            dq[((std::size_t(b) * Lq + i) * H + h) * D + d] += scale * ds * kj(j, d);
            dk[((std::size_t(b) * Lk + j) * Hkv + g) * D + d] += scale * ds * qi(d);
          }
          for (int c = 0; c < Dv; ++c) dv[((std::size_t(b) * Lk + j) * Hkv + g) * Dv + c] += pr[j] * doi(c);
        }
      }
    }
  }
  auto poisoned = [](std::size_t n) {
    void* d = nullptr;
    CHECK(cudaMalloc(&d, n * 4));
    CHECK(cudaMemset(d, 0xff, n * 4));
    return d;
  };
  BackwardParams p;
  ForwardParams& f = p.fwd;
  f.q = upload(q), f.k = upload(k), f.v = upload(v);
  p.dout = upload(dout);
  p.lse_log2 = static_cast<float*>(upload(lse_log2));
  p.delta = static_cast<float*>(upload(delta));
  p.dq = poisoned(q.size()), p.dk = poisoned(k.size()), p.dv = poisoned(v.size());
  f.q_row_stride = std::int64_t(H) * D, f.q_batch_stride = f.q_row_stride * Lq, f.q_head_stride = D;
  f.k_row_stride = std::int64_t(Hkv) * D, f.k_batch_stride = f.k_row_stride * Lk;
  f.k_head_stride = D;
  f.v_row_stride = std::int64_t(Hkv) * Dv, f.v_batch_stride = f.v_row_stride * Lk;
  f.v_head_stride = Dv;
  p.dout_row_stride = std::int64_t(H) * Dv, p.dout_batch_stride = p.dout_row_stride * Lq;
  p.dout_head_stride = Dv;
  p.dq_row_stride = f.q_row_stride, p.dq_batch_stride = f.q_batch_stride, p.dq_head_stride = D;
  p.dk_row_stride = f.k_row_stride, p.dk_batch_stride = f.k_batch_stride, p.dk_head_stride = D;
  p.dv_row_stride = f.v_row_stride, p.dv_batch_stride = f.v_batch_stride, p.dv_head_stride = Dv;
  p.stat_batch_stride = std::int64_t(H) * Lq, p.stat_head_stride = Lq;
  f.batch = B, f.seqlen_q = Lq, f.seqlen_k = Lk, f.heads = H, f.kv_group = G;
  f.head_dim = D, f.value_dim = Dv;
  f.scale_log2 = float(scale * 1.4426950408889634);
  p.scale = float(scale);
  if (causal) f.window_right = 0;
  launch_or_exit(launch_sm90_backward(p, causal));
  auto error = [](void* d, const std::vector<double>& ref) {
    std::vector<float> got(ref.size());
    CHECK(cudaMemcpy(got.data(), d, got.size() * 4, cudaMemcpyDeviceToHost));
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      err += (got[i] - ref[i]) * (got[i] - ref[i]);
      norm += ref[i] * ref[i];
    }
    return std::sqrt(err / norm);
  };
  std::printf(
      "check backward B=%d H=%d Hkv=%d Lq=%d Lk=%d D=%d Dv=%d causal=%d: dq %.2e dk %.2e dv %.2e\n",
      B, H, Hkv, Lq, Lk, D, Dv, causal, error(p.dq, dq), error(p.dk, dk), error(p.dv, dv));
  for (const void* d : {f.q, f.k, f.v, p.dout, static_cast<const void*>(p.lse_log2),
                        static_cast<const void*>(p.delta), static_cast<const void*>(p.dq),
                        static_cast<const void*>(p.dk), static_cast<const void*>(p.dv)}) {
    CHECK(cudaFree(const_cast<void*>(d)));
  }
}

}  // namespace

int main() {
  using namespace fmha::cuda;
  check(1, 2, 1, 200, 300, 64, 64, false);
  check(2, 4, 2, 129, 65, 40, 24, true);
  check(1, 2, 2, 300, 1000, 64, 48, false);
  check_backward(1, 2, 1, 200, 300, 64, 64, false);
  check_backward(2, 4, 2, 129, 65, 40, 24, true);
  check_backward(1, 2, 2, 300, 1000, 64, 48, false);
  check_backward(1, 2, 1, 90, 300, 64, 64, true);
  const int B = 4, H = 16, L = 2048, D = 64;
  std::mt19937 gen(42);
  const std::size_t n = std::size_t(B) * L * H * D;
  ForwardParams p;
  p.q = device_random(n, gen, false);
  p.k = device_random(n, gen, false);
  p.v = device_random(n, gen, false);
  CHECK(cudaMalloc(&p.out, n * 4));
  set_dense_forward(p, B, H, L, D);
  for (bool causal : {false, true}) {
    p.window_right = causal ? 0 : kUnboundedWindow;
    const double flops = 4.0 * (causal ? double(L) * (L + 1) / 2 : double(L) * L) * D * B * H;
    const auto sm90 = sorted_launch_ms([&] { launch_or_exit(launch_sm90(p, causal)); }, 50);
    const auto sm80 = sorted_launch_ms(
        [&] {
          launch_or_exit(causal ? sm80::launch_forward<float, 64, PolicyGeneral>(p, nullptr)
                                : sm80::launch_forward<float, 64, PolicyPlain>(p, nullptr));
        },
        50);
    std::printf("fp32 B=%d H=%d L=%d D=%d causal=%d: sm90 planes %.4f ms (p10 %.4f p90 %.4f, "
                "%.1f TFLOP/s), sm80 %.4f ms (%.1f TFLOP/s)\n",
                B, H, L, D, causal, sm90[25], sm90[5], sm90[45], flops / sm90[25] / 1e9, sm80[25],
                flops / sm80[25] / 1e9);
  }
  BackwardParams bp;
  bp.fwd = p;
  bp.dout = device_random(n, gen, false);
  bp.lse_log2 = static_cast<float*>(device_random(std::size_t(B) * H * L, gen, false));
  bp.delta = static_cast<float*>(device_random(std::size_t(B) * H * L, gen, false));
  CHECK(cudaMalloc(&bp.dq, n * 4));
  CHECK(cudaMalloc(&bp.dk, n * 4));
  CHECK(cudaMalloc(&bp.dv, n * 4));
  set_dense_backward(bp, B, H, L, D);
  for (bool causal : {false, true}) {
    bp.fwd.window_right = causal ? 0 : kUnboundedWindow;
    const double flops = 10.0 * (causal ? double(L) * (L + 1) / 2 : double(L) * L) * D * B * H;
    const auto ms = sorted_launch_ms([&] { launch_or_exit(launch_sm90_backward(bp, causal)); }, 50);
    // Its parts on planes written once: the passes, the dK/dV kernel, the dQ kernel.
    float* workspace = nullptr;
    CHECK(cudaMalloc(&workspace, sm90::fp32_backward_planes_floats(bp.fwd) * 4));
    sm90::Fp32BackwardPlanes planes;
    auto ok = [](cudaError_t e) { CHECK(e); };
    const auto passes =
        sorted_launch_ms([&] { ok(sm90::write_backward_planes(bp, workspace, &planes, 0)); }, 50);
    const auto dkdv = sorted_launch_ms(
        [&] {
          ok(causal ? sm90::launch_backward_fp32_dkdv<PolicyWindow>(bp, planes, 0)
                    : sm90::launch_backward_fp32_dkdv<PolicyPlain>(bp, planes, 0));
        },
        50);
    const auto dq = sorted_launch_ms(
        [&] {
          ok(causal ? sm90::launch_backward_fp32_dq<PolicyWindow>(bp, planes, 0)
                    : sm90::launch_backward_fp32_dq<PolicyPlain>(bp, planes, 0));
        },
        50);
    CHECK(cudaFree(workspace));
    std::printf("fp32 backward B=%d H=%d L=%d D=%d causal=%d: sm90 planes %.4f ms (p10 %.4f p90 "
                "%.4f, %.1f TFLOP/s); passes %.4f, dK/dV %.4f, dQ %.4f\n",
                B, H, L, D, causal, ms[25], ms[5], ms[45], flops / ms[25] / 1e9, passes[25],
                dkdv[25], dq[25]);
  }
  return 0;
}
