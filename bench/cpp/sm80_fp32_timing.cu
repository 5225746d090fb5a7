// sm80-fp32-timing: the fp32 kernels (sm80, mma.sync on tf32) of issue 4's fp32 case (B 4, H 16,
// L 2048, D 64) alone, launched through their launchers on random inputs: the forward (the plain
// policy, as the library runs it without options), the fused
// backward's dK/dV kernel (dQ by atomics into an fp32 workspace) and the split backward's two
// kernels, each in exact mode (3xTF32, the default) and with allow_tf32, for comparing builds of
// the kernels without the library or Python. CUDA events around each launch, the L2 flushed in
// between, the median of 30 runs. The row statistics (lse, Delta) are random: the kernels' work
// does not depend on them. No correctness check: the GPU suite is the test. Built by hand, from the
// source root, for the device at hand (sm_90a here):
//
//   nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a \
//        -Isrc -Iinclude -DVARIANT='"main"' -o sm80-fp32-timing \
//        bench/cpp/sm80_fp32_timing.cu -lcuda
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda/sm80/launch_bwd.cuh"
#include "cuda/sm80/launch_fwd.cuh"
#include "kernel_timing.h"

#ifndef VARIANT
#define VARIANT "build"
#endif

namespace fmha::cuda::sm80 {
template Status launch_forward<float, 64, PolicyPlain>(const ForwardParams&, cudaStream_t);
template Status launch_backward_dq<float, 64, PolicyGeneral>(const BackwardParams&, cudaStream_t);
template Status launch_backward_dkdv<float, 64, PolicyGeneral>(const BackwardParams&, cudaStream_t);
}  // namespace fmha::cuda::sm80

int main() {
  using namespace fmha::cuda;
  const int B = 4, H = 16, L = 2048, D = 64;
  std::mt19937 gen(42);
  auto random_floats = [&](std::size_t count) {
    return static_cast<float*>(device_random(count, gen, /*bf16=*/false));
  };
  const std::size_t n = std::size_t(B) * L * H * D, stats = std::size_t(B) * H * L;
  BackwardParams p;
  ForwardParams& f = p.fwd;
  f.q = random_floats(n);
  f.k = random_floats(n);
  f.v = random_floats(n);
  p.dout = random_floats(n);
  CHECK(cudaMalloc(&f.out, n * 4));
  CHECK(cudaMalloc(&f.lse, stats * 4));
  CHECK(cudaMalloc(&p.dq, n * 4));
  CHECK(cudaMalloc(&p.dk, n * 4));
  CHECK(cudaMalloc(&p.dv, n * 4));
  float* dq_accum = nullptr;
  CHECK(cudaMalloc(&dq_accum, n * 4));
  CHECK(cudaMemset(dq_accum, 0, n * 4));
  p.delta = random_floats(stats);
  p.lse_log2 = random_floats(stats);
  set_dense_backward(p, B, H, L, D);
  // The sm80 fused layout: [B, H, Lq, D] by row.
  const std::int64_t accum_head = std::int64_t(L) * D;

  for (bool tf32 : {false, true}) {
    f.allow_tf32 = tf32;
    const char* mode = tf32 ? "tf32" : "exact";
    const float fwd =
        median_launch_ms([&] { return sm80::launch_forward<float, 64, PolicyPlain>(f, 0); });
    p.dq_accum = dq_accum;
    p.accum_row_stride = D;
    p.accum_head_stride = accum_head;
    p.accum_batch_stride = H * accum_head;
    const float fused = median_launch_ms(
        [&] { return sm80::launch_backward_dkdv<float, 64, PolicyGeneral>(p, 0); });
    p.dq_accum = nullptr;
    const float split_dkdv = median_launch_ms(
        [&] { return sm80::launch_backward_dkdv<float, 64, PolicyGeneral>(p, 0); });
    const float split_dq =
        median_launch_ms([&] { return sm80::launch_backward_dq<float, 64, PolicyGeneral>(p, 0); });
    std::printf(
        "%s %s B=%d H=%d L=%d D=%d forward %.4f ms | fused dK/dV+dQ atomics %.4f | split dK/dV "
        "%.4f + dQ %.4f = %.4f\n",
        VARIANT, mode, B, H, L, D, fwd, fused, split_dkdv, split_dq, split_dkdv + split_dq);
  }
  return 0;
}
