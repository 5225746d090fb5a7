// What the kernel timing tools (sm90_forward_timing.cu, sm90_backward_timing.cu,
// sm80_fp32_timing.cu, mma_sync_peak.cu) share: a CUDA error check that exits, random device
// inputs, and the timing loop: CUDA events around each launch, the L2 flushed before each by a
// 256 MB memset, after three warm-up launches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

// n random normal values on the device, bfloat16 or fp32; never freed (the tools exit).
inline void* device_random(std::size_t n, std::mt19937& gen, bool bf16) {
  std::normal_distribution<float> dist;
  void* d = nullptr;
  if (bf16) {
    std::vector<__nv_bfloat16> host(n);
    for (auto& x : host) x = __float2bfloat16(dist(gen));
    CHECK(cudaMalloc(&d, n * 2));
    CHECK(cudaMemcpy(d, host.data(), n * 2, cudaMemcpyHostToDevice));
  } else {
    std::vector<float> host(n);
    for (auto& x : host) x = dist(gen);
    CHECK(cudaMalloc(&d, n * 4));
    CHECK(cudaMemcpy(d, host.data(), n * 4, cudaMemcpyHostToDevice));
  }
  return d;
}

// The milliseconds of `runs` launches of `launch` (a callable that launches once on the default
// stream), sorted.
template <typename Launch>
std::vector<float> sorted_launch_ms(const Launch& launch, int runs) {
  const std::size_t flush_bytes = 256u << 20;
  void* flush = nullptr;
  CHECK(cudaMalloc(&flush, flush_bytes));
  for (int i = 0; i < 3; ++i) launch();
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < runs; ++i) {
    CHECK(cudaMemsetAsync(flush, i, flush_bytes));
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  CHECK(cudaFree(flush));
  std::sort(ms.begin(), ms.end());
  return ms;
}
