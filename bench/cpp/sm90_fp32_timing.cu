// sm90-fp32-timing: the sm90 fp32 forward (tf32 wgmma on split planes, mainloop_fwd_fp32.cuh)
// against the sm80 fp32 forward (mma.sync on tf32) on issue 4's fp32 case (B 4, H 16, L 2048,
// D 64; plain and causal), each through its launcher on random inputs: CUDA events around each
// launch (the sm90 one includes its planes pass and their allocation), the L2 flushed in between,
// the median of 50 runs. First a quick check of the sm90 kernel against a float64 reference on
// small odd shapes (norm-wise relative error of out and lse), for iterating on the kernel without
// the library; the GPU suite is the test. Built by hand, from the source root, for sm_90a:
//
//   nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a \
//        -Isrc -Iinclude -o sm90-fp32-timing bench/cpp/sm90_fp32_timing.cu \
//        src/cuda/workspace_pool.cu -lcuda
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda/sm80/launch_fwd.cuh"
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
}  // namespace sm90
}  // namespace fmha::cuda

using fmha::cuda::ForwardParams;

namespace {

void launch_or_exit(const fmha::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "launch failed: %s\n", s.message().c_str());
    std::exit(1);
  }
}

fmha::Status launch_sm90(const ForwardParams& p, bool causal) {
  using namespace fmha::cuda;
  return causal ? sm90::launch_forward_fp32<float, 64, PolicyWindow>(p, nullptr)
                : sm90::launch_forward_fp32<float, 64, PolicyPlain>(p, nullptr);
}

// [B, L, H, D] contiguous inputs (kv heads Hkv), float64 reference of out and lse, top-left
// causal or none; prints the norm-wise relative errors of the sm90 kernel.
void check(int B, int H, int Hkv, int Lq, int Lk, int D, int Dv, bool causal) {
  std::mt19937 gen(7);
  std::normal_distribution<float> dist;
  auto fill = [&](std::size_t n) {
    std::vector<float> h(n);
    for (auto& x : h) x = dist(gen);
    return h;
  };
  const auto q = fill(std::size_t(B) * Lq * H * D), k = fill(std::size_t(B) * Lk * Hkv * D),
             v = fill(std::size_t(B) * Lk * Hkv * Dv);
  auto upload = [](const std::vector<float>& h) {
    void* d = nullptr;
    CHECK(cudaMalloc(&d, h.size() * 4));
    CHECK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
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

}  // namespace

int main() {
  using namespace fmha::cuda;
  check(1, 2, 1, 200, 300, 64, 64, false);
  check(2, 4, 2, 129, 65, 40, 24, true);
  check(1, 2, 2, 300, 1000, 64, 48, false);
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
  return 0;
}
