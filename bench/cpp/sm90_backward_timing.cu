// sm90-backward-timing: the sm90 split backward's two kernels (dQ, dK/dV) alone, launched through
// their launchers on random bf16 inputs at the SAM-B shape (B 8, H 12, L 4096, D 64), without and
// with a [1, H, L, L] bias (the bias policy; no dbias), at D 128 without bias (B 2, H 16, L 8192:
// 16k tokens, hidden 2048), and at D 64 L 512 without and with causal (B 32, H 32), for comparing
// builds of the kernels without the library or Python: CUDA events around each launch, the L2
// flushed in between, the median of 30 runs; then each case's two kernels as the split backward
// launches them, dK/dV then dQ, one after the other and with the dQ kernel overlapping the dK/dV
// kernel (p.dq_overlaps_dkdv), on a stream of their own. The row statistics (lse, Delta) are
// random too: the kernels' work does not depend on them. No correctness check (the GPU suite is
// the test), but each case prints a digest of its dq, dk and dv, which two builds of the same
// arithmetic must share (the inputs are seeded). Built by hand for sm_90a:
//
//   nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a \
//        -Isrc -Iinclude -DVARIANT='"main"' -o sm90-backward-timing \
//        bench/cpp/sm90_backward_timing.cu -lcuda
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda/sm90/launch_bwd.cuh"
#include "kernel_timing.h"

#ifndef VARIANT
#define VARIANT "build"
#endif

namespace fmha::cuda::sm90 {
template Status launch_backward_dq<__nv_bfloat16, 64, PolicyPlain>(const BackwardParams&,
                                                                   cudaStream_t);
template Status launch_backward_dq<__nv_bfloat16, 64, PolicyBias>(const BackwardParams&,
                                                                  cudaStream_t);
template Status launch_backward_dq<__nv_bfloat16, 64, PolicyWindow>(const BackwardParams&,
                                                                    cudaStream_t);
template Status launch_backward_dkdv<__nv_bfloat16, 64, PolicyWindow>(const BackwardParams&,
                                                                      cudaStream_t);
template Status launch_backward_dq<__nv_bfloat16, 128, PolicyPlain>(const BackwardParams&,
                                                                    cudaStream_t);
template Status launch_backward_dkdv<__nv_bfloat16, 64, PolicyPlain>(const BackwardParams&,
                                                                     cudaStream_t);
template Status launch_backward_dkdv<__nv_bfloat16, 64, PolicyBias>(const BackwardParams&,
                                                                    cudaStream_t);
template Status launch_backward_dkdv<__nv_bfloat16, 128, PolicyPlain>(const BackwardParams&,
                                                                      cudaStream_t);
}  // namespace fmha::cuda::sm90

namespace {

using fmha::cuda::BackwardParams;

// Random inputs of one dense shape (bf16, [B, L, H, D]); the outputs allocated, nothing freed
// (the process ends after timing).
BackwardParams dense_inputs(int B, int H, int L, int D, std::mt19937& gen) {
  const std::size_t n = std::size_t(B) * L * H * D;
  BackwardParams p;
  p.fwd.q = device_random(n, gen, true);
  p.fwd.k = device_random(n, gen, true);
  p.fwd.v = device_random(n, gen, true);
  p.dout = device_random(n, gen, true);
  CHECK(cudaMalloc(&p.dq, n * 2));
  CHECK(cudaMalloc(&p.dk, n * 2));
  CHECK(cudaMalloc(&p.dv, n * 2));
  p.delta = static_cast<float*>(device_random(std::size_t(B) * H * L, gen, false));
  p.lse_log2 = static_cast<float*>(device_random(std::size_t(B) * H * L, gen, false));
  set_dense_backward(p, B, H, L, D);
  return p;
}

void report(const char* what, const char* kernel, int B, int H, int L, int D, bool with_bias,
            float ms) {
  std::printf("%s %s%s%s B=%d H=%d L=%d D=%d bias=%d median %.4f ms\n", VARIANT, what,
              *what ? " " : "", kernel, B, H, L, D, with_bias, ms);
}

// One case of the split backward's two kernels (launchers dkdv, dq: callables of the params and a
// stream): "<what> dQ" and "<what> dK/dV" alone on the default stream, then "<what> dK/dV+dQ",
// dK/dV then dQ as the backward launches them, one after the other and overlapped
// (p.dq_overlaps_dkdv), on a stream of their own.
template <typename DkDv, typename Dq>
void report_case(const char* what, BackwardParams p, int B, int H, int L, int D, bool with_bias,
                 const DkDv& dkdv, const Dq& dq) {
  report(what, "dQ", B, H, L, D, with_bias, median_launch_ms([&] { return dq(p, 0); }));
  report(what, "dK/dV", B, H, L, D, with_bias, median_launch_ms([&] { return dkdv(p, 0); }));
  static cudaStream_t stream = [] {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }();
  for (bool overlap : {false, true}) {
    p.dq_overlaps_dkdv = overlap;
    const float ms = median_launch_ms(
        [&] {
          const fmha::Status s = dkdv(p, stream);
          return s.ok() ? dq(p, stream) : s;
        },
        stream);
    report(what, overlap ? "dK/dV+dQ overlapped" : "dK/dV+dQ", B, H, L, D, with_bias, ms);
  }
  CHECK(cudaStreamSynchronize(stream));
  const std::size_t bytes = std::size_t(B) * L * H * D * 2;
  std::printf("%s %s%sdigest dq %016llx dk %016llx dv %016llx\n", VARIANT, what, *what ? " " : "",
              device_digest(p.dq, bytes), device_digest(p.dk, bytes), device_digest(p.dv, bytes));
}

}  // namespace

int main() {
  using namespace fmha::cuda;
  using sm90::launch_backward_dkdv;
  using sm90::launch_backward_dq;
  using bf16 = __nv_bfloat16;
  std::mt19937 gen(42);
  {
    const int B = 8, H = 12, L = 4096, D = 64;
    BackwardParams p = dense_inputs(B, H, L, D, gen);
    report_case("", p, B, H, L, D, false, launch_backward_dkdv<bf16, 64, PolicyPlain>,
                launch_backward_dq<bf16, 64, PolicyPlain>);
    ForwardParams& f = p.fwd;  // a [1, H, L, L] bias, contiguous: a batch stride of 0
    f.bias = device_random(std::size_t(H) * L * L, gen, true);
    f.bias_stride[0] = 0;
    f.bias_stride[1] = std::int64_t(L) * L;
    f.bias_stride[2] = L;
    f.bias_stride[3] = 1;
    report_case("", p, B, H, L, D, true, launch_backward_dkdv<bf16, 64, PolicyBias>,
                launch_backward_dq<bf16, 64, PolicyBias>);
  }
  {
    const int B = 2, H = 16, L = 8192, D = 128;
    const BackwardParams p = dense_inputs(B, H, L, D, gen);
    report_case("", p, B, H, L, D, false, launch_backward_dkdv<bf16, 128, PolicyPlain>,
                launch_backward_dq<bf16, 128, PolicyPlain>);
  }
  {  // L 512, without and with causal (window policy: unbounded left, 0 right): few tiles a block
    const int B = 32, H = 32, L = 512, D = 64;
    BackwardParams p = dense_inputs(B, H, L, D, gen);
    report_case("", p, B, H, L, D, false, launch_backward_dkdv<bf16, 64, PolicyPlain>,
                launch_backward_dq<bf16, 64, PolicyPlain>);
    p.fwd.window_right = 0;
    report_case("causal", p, B, H, L, D, false, launch_backward_dkdv<bf16, 64, PolicyWindow>,
                launch_backward_dq<bf16, 64, PolicyWindow>);
  }
  return 0;
}
