// What the kernel timing tools (sm90_forward_timing.cu, sm90_backward_timing.cu,
// sm80_fp32_timing.cu, mma_sync_peak.cu) share: a CUDA error check that exits, random device
// inputs, a dense problem's layout, and the timing loop: CUDA events around each launch, the L2
// flushed before each by a 256 MB memset, after three warm-up launches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <type_traits>
#include <vector>

#include "cuda/common/backward_params.h"

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

// Fills d[0, n) with normal values drawn on the device (Box-Muller on two uniforms hashed from
// (seed, index) by splitmix64): the host's generator took about a second per 100 M values, most
// of a timing run.
template <typename T>
__global__ void fill_normal(T* d, std::size_t n, unsigned long long seed) {
  auto mix = [](unsigned long long z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const std::size_t step = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += step) {
    const unsigned long long bits = mix(seed ^ mix(i));
    const float u1 = (static_cast<float>(bits >> 40) + 0.5f) * (1.0f / 16777216.0f);  // (0, 1)
    const float u2 = static_cast<float>(bits & 0xffffffu) * (1.0f / 16777216.0f);
    const float x = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    if constexpr (std::is_same_v<T, float>) {
      d[i] = x;
    } else {
      d[i] = __float2bfloat16(x);
    }
  }
}

// n random normal values on the device, bfloat16 or fp32, seeded from `gen`; never freed (the
// tools exit).
inline void* device_random(std::size_t n, std::mt19937& gen, bool bf16) {
  void* d = nullptr;
  const unsigned long long seed = (static_cast<unsigned long long>(gen()) << 32) | gen();
  CHECK(cudaMalloc(&d, n * (bf16 ? 2 : 4)));
  if (bf16) {
    fill_normal<<<1024, 256>>>(static_cast<__nv_bfloat16*>(d), n, seed);
  } else {
    fill_normal<<<1024, 256>>>(static_cast<float*>(d), n, seed);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  return d;
}

// A digest (FNV-1a, 64-bit) of `bytes` of device memory, for telling whether two builds of a kernel
// wrote the same output on the same inputs.
inline unsigned long long device_digest(const void* d, std::size_t bytes) {
  std::vector<unsigned char> host(bytes);
  CHECK(cudaMemcpy(host.data(), d, bytes, cudaMemcpyDeviceToHost));
  unsigned long long h = 1469598103934665603ull;
  for (unsigned char c : host) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The milliseconds of `runs` launches of `launch` (a callable that launches once on `stream`, the
// default one unless given), sorted. flush_l2 false: no flush in between, so a launch finds in L2
// what the last one left there (a kernel that reads what the one before it wrote).
template <typename Launch>
std::vector<float> sorted_launch_ms(const Launch& launch, int runs, cudaStream_t stream = 0,
                                    bool flush_l2 = true) {
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
    if (flush_l2) CHECK(cudaMemsetAsync(flush, i, flush_bytes, stream));
    CHECK(cudaEventRecord(a, stream));
    launch();
    CHECK(cudaEventRecord(b, stream));
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

// The median milliseconds of 30 launches of `launch`, a callable that launches through an fmha
// launcher on `stream` and returns its Status; exits on a failed launch.
template <typename Launch>
float median_launch_ms(const Launch& launch, cudaStream_t stream = 0) {
  return sorted_launch_ms(
      [&] {
        if (!launch().ok()) {
          std::fprintf(stderr, "launch failed\n");
          std::exit(1);
        }
      },
      30, stream)[15];
}

// A dense problem of B batches x L tokens x H heads of D (q, k, v, out [B, L, H, D] contiguous,
// lse [B, H, L]) at the scale 1 / sqrt(D): sizes and strides; the pointers stay the caller's.
inline void set_dense_forward(fmha::cuda::ForwardParams& f, int B, int H, int L, int D) {
  const std::int64_t row = std::int64_t(H) * D, batch = std::int64_t(L) * row;
  f.q_batch_stride = f.k_batch_stride = f.v_batch_stride = f.out_batch_stride = batch;
  f.q_row_stride = f.k_row_stride = f.v_row_stride = f.out_row_stride = row;
  f.q_head_stride = f.k_head_stride = f.v_head_stride = f.out_head_stride = D;
  f.lse_batch_stride = std::int64_t(H) * L;
  f.lse_head_stride = L;
  f.lse_row_stride = 1;
  f.batch = B;
  f.seqlen_q = f.seqlen_k = L;
  f.heads = H;
  f.kv_group = 1;
  f.head_dim = f.value_dim = D;
  f.vector_loads = f.vector_stores = true;
  f.scale_log2 = 1.0f / std::sqrt(float(D)) * 1.4426950408889634f;
}

// set_dense_forward, and dout and the gradients [B, L, H, D] contiguous, the row statistics
// [B, H, L].
inline void set_dense_backward(fmha::cuda::BackwardParams& p, int B, int H, int L, int D) {
  set_dense_forward(p.fwd, B, H, L, D);
  const std::int64_t row = std::int64_t(H) * D, batch = std::int64_t(L) * row;
  p.dout_batch_stride = p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = batch;
  p.dout_row_stride = p.dq_row_stride = p.dk_row_stride = p.dv_row_stride = row;
  p.dout_head_stride = p.dq_head_stride = p.dk_head_stride = p.dv_head_stride = D;
  p.stat_batch_stride = std::int64_t(H) * L;
  p.stat_head_stride = L;
  p.scale = 1.0f / std::sqrt(float(D));
}

// Frees what a backward tool allocated for `p`: q, k, v, dout, dq, dk, dv, the row statistics and
// the dQ accumulator (cudaFree ignores the null ones).
inline void free_backward_buffers(fmha::cuda::BackwardParams& p) {
  for (void* ptr : {const_cast<void*>(p.fwd.q), const_cast<void*>(p.fwd.k),
                    const_cast<void*>(p.fwd.v), const_cast<void*>(p.dout), p.dq, p.dk, p.dv,
                    static_cast<void*>(p.lse_log2), static_cast<void*>(p.delta),
                    static_cast<void*>(p.dq_accum)}) {
    CHECK(cudaFree(ptr));
  }
}
