// mma-sync-peak: the tensor-core rate of one mma.sync shape on this GPU, from registers alone (no
// memory): every warp of a full grid runs chains of independent products, and the FLOPs over the
// kernel's CUDA-event time give the shape's peak. For the sm80 kernels' cost model on Hopper,
// where fp32 runs 3xTF32 on m16n8k8 (three products a k-step) and the 16-bit types m16n8k16.
// Built by hand, from the source root:
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//        -o mma-sync-peak bench/cpp/mma_sync_peak.cu
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda/common/tile_primitives.cuh"
#include "kernel_timing.h"

namespace {

constexpr int kChains = 8;  // independent accumulators a warp: hides the products' latency
constexpr int kSteps = 4096;

// kind 0: m16n8k8 tf32, 1: m16n8k16 bf16.
template <int kKind>
__global__ void __launch_bounds__(256) products(float* sink, std::uint32_t seed) {
  std::uint32_t a[4], b0 = seed * 3u, b1 = seed * 5u;
  for (int i = 0; i < 4; ++i) a[i] = seed + threadIdx.x + i;
  float d[kChains][4] = {};
  for (int step = 0; step < kSteps; ++step) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (kKind == 0) {
        fmha::cuda::tile::mma_m16n8k8_tf32(d[c], a, b0, b1);
      } else {
        fmha::cuda::tile::mma_m16n8k16<__nv_bfloat16>(d[c], a, b0, b1);
      }
    }
  }
  float total = 0.0f;
  for (int c = 0; c < kChains; ++c) total += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  if (total == 1.2345f) *sink = total;  // keeps the products alive
}

// blocks_per_sm of 8 warps: 8 (64 warps an SM, the peak), 1 (8 warps, two a scheduler: the sm80
// fp32 kernels' occupancy).
template <int kKind>
void measure(const char* name, int flop_per_product, int blocks_per_sm) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* sink = nullptr;
  CHECK(cudaMalloc(&sink, 4));
  const int blocks = sms * blocks_per_sm;
  const float ms = sorted_launch_ms([&] { products<kKind><<<blocks, 256>>>(sink, 7u); }, 10)[5];
  const double flop = double(blocks) * 8 * kSteps * kChains * flop_per_product;
  std::printf("%-20s %2d warps an SM %8.1f TFLOP/s  (%d SMs, %.3f ms)\n", name, 8 * blocks_per_sm,
              flop / ms * 1e-9, sms, ms);
  CHECK(cudaFree(sink));
}

}  // namespace

int main() {
  for (int blocks_per_sm : {8, 1}) {
    measure<0>("mma m16n8k8 tf32", 2 * 16 * 8 * 8, blocks_per_sm);
    measure<1>("mma m16n8k16 bf16", 2 * 16 * 8 * 16, blocks_per_sm);
  }
  return 0;
}
