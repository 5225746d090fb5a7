// sm90-fused-d256-timing: the warp-specialized fused backward of D 256
// (mainloop_bwd_fused_d256.cuh) alone, through its launcher, on random bf16 inputs at the standard
// grid's D 256 cells (16k tokens, 8 heads: B = 16384 / L, L 512 to 16384, causal and not): CUDA
// events around each launch, the L2 flushed before each, the median of 30 runs. The time includes
// zeroing the dQ accumulator, as the library does before the kernel, but not the accumulator's
// conversion into dq, nor the preprocess (Delta). The row statistics are constants of the right
// size (the work does not depend on them). No correctness check (the GPU suite is the test); each
// cell prints a digest of dk and dv, which two builds of the same arithmetic share. Built by hand
// for sm_90a:
//
//   nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a \
//        -Isrc -Iinclude -o sm90-fused-d256-timing bench/cpp/sm90_fused_d256_timing.cu -lcuda
//
// To time an edited copy of the kernel (a stage left out, another way of adding dQ), put it at
// DIR/cuda/sm90/mainloop_bwd_fused_d256.cuh and pass -IDIR before -Isrc. Arguments: `L causal`
// pairs to time only those cells (e.g. `4096 0 16384 1`); a first argument `split` times the split
// form instead, as the library runs it at D 256: the kernel without its dQ part (dK and dV), the
// dQ kernel (mainloop_bwd_dq.cuh), each alone, and the two launched as the backward does (the dQ
// kernel overlapping the first); each cell prints a digest of dq, dk and dv.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/sm90/launch_bwd.cuh"
#include "cuda/sm90/launch_bwd_fused_d256.cuh"
#include "kernel_timing.h"

namespace fmha::cuda::sm90 {
template Status launch_backward_fused_d256<__nv_bfloat16, 256, PolicyPlain>(const BackwardParams&,
                                                                            cudaStream_t);
template Status launch_backward_fused_d256<__nv_bfloat16, 256, PolicyWindow>(const BackwardParams&,
                                                                             cudaStream_t);
template Status launch_backward_dq<__nv_bfloat16, 256, PolicyPlain>(const BackwardParams&,
                                                                    cudaStream_t);
template Status launch_backward_dq<__nv_bfloat16, 256, PolicyWindow>(const BackwardParams&,
                                                                     cudaStream_t);
}  // namespace fmha::cuda::sm90

namespace {

using fmha::Status;
using fmha::cuda::BackwardParams;
namespace sm90 = fmha::cuda::sm90;

void time_cell(int L, bool causal, bool split, std::mt19937& gen) {
  constexpr int kD = 256, kH = 2048 / kD;
  const int B = 16384 / L;
  const std::size_t n = std::size_t(B) * L * kH * kD;
  BackwardParams p;
  set_dense_backward(p, B, kH, L, kD);
  if (causal) p.fwd.window_right = 0;
  p.fwd.q = device_random(n, gen, true);
  p.fwd.k = device_random(n, gen, true);
  p.fwd.v = device_random(n, gen, true);
  p.dout = device_random(n, gen, true);
  CHECK(cudaMalloc(&p.dq, n * 2));
  CHECK(cudaMalloc(&p.dk, n * 2));
  CHECK(cudaMalloc(&p.dv, n * 2));
  // Statistics of about the right size: lse near log2(L), Delta small.
  const std::size_t stats = std::size_t(B) * kH * L;
  const std::vector<float> lse(stats, std::log2(float(L))), delta(stats, 0.01f);
  CHECK(cudaMalloc(&p.lse_log2, stats * 4));
  CHECK(cudaMalloc(&p.delta, stats * 4));
  CHECK(cudaMemcpy(p.lse_log2, lse.data(), stats * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(p.delta, delta.data(), stats * 4, cudaMemcpyHostToDevice));
  // The by-column accumulator, as backward.cu lays it out: per (batch, head) D columns of Lq
  // queries rounded up to 4.
  const std::int64_t inner_pad = (L + 3) / 4 * 4;
  p.accum_row_stride = 1;
  p.accum_col_stride = inner_pad;
  p.accum_head_stride = kD * inner_pad;
  p.accum_batch_stride = kH * kD * inner_pad;
  const std::size_t accum_bytes = std::size_t(B) * p.accum_batch_stride * 4;
  CHECK(cudaMalloc(&p.dq_accum, accum_bytes));
  const double pairs = causal ? double(L) * (L + 1) / 2 : double(L) * L;
  const double flops = 2.5 * 4.0 * B * kH * pairs * kD;
  if (split) {
    CHECK(cudaFree(p.dq_accum));
    p.dq_accum = nullptr;  // the kernel without its dQ part
    const auto dkdv = [&](cudaStream_t stream) {
      return causal ? sm90::launch_backward_fused_d256<__nv_bfloat16, 256,
                                                       fmha::cuda::PolicyWindow>(p, stream)
                    : sm90::launch_backward_fused_d256<__nv_bfloat16, 256, fmha::cuda::PolicyPlain>(
                          p, stream);
    };
    const auto dq = [&](cudaStream_t stream) {
      return causal ? sm90::launch_backward_dq<__nv_bfloat16, 256, fmha::cuda::PolicyWindow>(
                          p, stream)
                    : sm90::launch_backward_dq<__nv_bfloat16, 256, fmha::cuda::PolicyPlain>(
                          p, stream);
    };
    const float dkdv_ms = median_launch_ms([&] { return dkdv(0); });
    const float dq_ms = median_launch_ms([&] { return dq(0); });
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    p.dq_overlaps_dkdv = true;
    const float pair_ms = median_launch_ms(
        [&] {
          const Status s = dkdv(stream);
          return s.ok() ? dq(stream) : s;
        },
        stream);
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaStreamDestroy(stream));
    std::printf(
        "D=256 L=%5d causal=%d split: dK/dV %.3f ms, dQ %.3f ms, both %.3f ms  %4.0f TFLOP/s  "
        "dq %016llx dk %016llx dv %016llx\n",
        L, causal, dkdv_ms, dq_ms, pair_ms, flops / pair_ms * 1e-9, device_digest(p.dq, n * 2),
        device_digest(p.dk, n * 2), device_digest(p.dv, n * 2));
    free_backward_buffers(p);
    return;
  }
  const auto launch = [&] {
    CHECK(cudaMemsetAsync(p.dq_accum, 0, accum_bytes));
    return causal ? sm90::launch_backward_fused_d256<__nv_bfloat16, 256, fmha::cuda::PolicyWindow>(
                        p, 0)
                  : sm90::launch_backward_fused_d256<__nv_bfloat16, 256, fmha::cuda::PolicyPlain>(
                        p, 0);
  };
  const float ms = median_launch_ms(launch);
  std::printf("D=256 L=%5d causal=%d  %.3f ms  %4.0f TFLOP/s  dk %016llx dv %016llx\n", L, causal,
              ms, flops / ms * 1e-9, device_digest(p.dk, n * 2), device_digest(p.dv, n * 2));
  free_backward_buffers(p);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  std::mt19937 gen(11);
  const bool split = argc > 1 && std::string(argv[1]) == "split";
  const int first = split ? 2 : 1;
  if (argc > first + 1) {
    for (int i = first; i + 1 < argc; i += 2)
      time_cell(std::atoi(argv[i]), std::atoi(argv[i + 1]) != 0, split, gen);
    return 0;
  }
  for (bool causal : {false, true}) {
    for (int L : {512, 1024, 2048, 4096, 8192, 16384}) time_cell(L, causal, split, gen);
  }
  return 0;
}
