// Launching the KV-cache attention kernels: the tensor-core kernel's instantiations by head-dim
// bucket, its split-count rule, and the launch of either attention kernel followed by the combine.
// Shared by kv_cache.cu (the library entry) and bench/cpp/kv_cache_decode_timing.cu, which times
// both kernels on the same inputs.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/kv_cache_kernels.cuh"
#include "cuda/kv_cache_mma.cuh"

namespace fmha::cuda::kv_cache {

// Index of a head-dim bucket (64, 128, 256) in per-bucket tables.
inline int bucket_index(int bucket) {
  return bucket <= 64 ? 0 : (bucket <= 128 ? 1 : 2);
}

// Lets every instantiation of the tensor-core kernel take up to `max_shared` bytes of dynamic
// shared memory (the device's opt-in limit). Once per device: the attribute is per device context.
template <typename T>
cudaError_t allow_mma_shared(int max_shared) {
  cudaError_t e = cudaFuncSetAttribute(kv_cache_mma_kernel<T, 64>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared);
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(kv_cache_mma_kernel<T, 128>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(kv_cache_mma_kernel<T, 256>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared);
  }
  return e;
}

// Registers per thread of the tensor-core kernel of one bucket (the fp16 and bf16 forms compile
// alike; the fp16 one is asked).
inline cudaError_t mma_registers(int bucket, int* registers) {
  cudaFuncAttributes a{};
  cudaError_t e = bucket <= 64    ? cudaFuncGetAttributes(&a, kv_cache_mma_kernel<__half, 64>)
                  : bucket <= 128 ? cudaFuncGetAttributes(&a, kv_cache_mma_kernel<__half, 128>)
                                  : cudaFuncGetAttributes(&a, kv_cache_mma_kernel<__half, 256>);
  *registers = a.numRegs;
  return e;
}

// Blocks of the tensor-core kernel one SM holds, from the device's limits.
inline int mma_blocks_per_sm(int shared, int reserved_per_block, int shared_per_sm, int registers,
                             int registers_per_sm, int threads_per_sm) {
  const int allocated = (std::max(registers, 1) + 7) / 8 * 8;  // allocation granularity: 8 a thread
  const int by_threads = threads_per_sm / kMmaThreads;
  const int by_shared = shared_per_sm / std::max(shared + reserved_per_block, 1);
  const int by_registers = registers_per_sm / (allocated * kMmaThreads);
  return std::max(std::min({by_threads, by_shared, by_registers}), 1);
}

// Key splits of the tensor-core kernel: `blocks` (sequence, kv head, row tile) blocks of up to
// `capacity` keys each, on `resident` block slots (SMs x blocks per SM). Every block of a split
// streams its keys at about the same rate, so the time goes as waves x (keys a split reads + a
// fixed cost per split, counted as kSplitCostKeys keys: the pipeline's fill, the epilogue, the
// combine's share); the rule takes the count of least time, the smaller on a tie (less workspace,
// a cheaper combine), with each split keeping at least two key tiles. At B 1, Hkv 8, L 128k on 132
// SMs with two blocks each it gives 33 splits: 264 blocks, one wave. A first rule, to be measured.
constexpr std::int64_t kSplitCostKeys = 2 * kTileKeys;

inline int split_rule(std::int64_t blocks, std::int64_t capacity, std::int64_t resident) {
  blocks = std::max<std::int64_t>(blocks, 1);
  resident = std::max<std::int64_t>(resident, 1);
  const std::int64_t limit =
      std::clamp<std::int64_t>((capacity + 2 * kTileKeys - 1) / (2 * kTileKeys), 1, kMaxSplits);
  int best = 1;
  double best_cost = 0.0;
  for (std::int64_t s = 1; s <= limit; ++s) {
    const std::int64_t waves = (blocks * s + resident - 1) / resident;
    const std::int64_t keys = ((capacity + s - 1) / s + kTileKeys - 1) / kTileKeys * kTileKeys;
    const double cost = static_cast<double>(waves) * static_cast<double>(keys + kSplitCostKeys);
    if (s == 1 || cost < best_cost) {
      best = static_cast<int>(s);
      best_cost = cost;
    }
  }
  return best;
}

// One attention call: the tensor-core kernel when `mma_stages` > 0 (with `shared` bytes, from
// mma_layout), else the CUDA-core kernel (`shared` from shared_layout); then, with several splits,
// the combine.
template <typename T>
cudaError_t launch_attention(const KvCacheKernelParams& k, int mma_stages, int shared,
                             cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(k.batch) * k.kv_heads * k.row_tiles, k.num_splits);
  if (mma_stages > 0) {
    switch (mma_bucket(k.head_dim, k.value_dim)) {
      case 64:
        kv_cache_mma_kernel<T, 64><<<grid, kMmaThreads, shared, stream>>>(k, mma_stages);
        break;
      case 128:
        kv_cache_mma_kernel<T, 128><<<grid, kMmaThreads, shared, stream>>>(k, mma_stages);
        break;
      default:
        kv_cache_mma_kernel<T, 256><<<grid, kMmaThreads, shared, stream>>>(k, mma_stages);
        break;
    }
  } else {
    kv_cache_attention_kernel<T><<<grid, kThreads, shared, stream>>>(k);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || k.num_splits <= 1) return e;
  const std::int64_t rows = k.total_q * k.heads;
  const auto blocks =
      static_cast<unsigned>(std::min<std::int64_t>((rows + kWarps - 1) / kWarps, 1 << 20));
  kv_cache_combine_kernel<T><<<blocks, kThreads, 0, stream>>>(k);
  return cudaGetLastError();
}

}  // namespace fmha::cuda::kv_cache
