// Launching the KV-cache attention kernels: the tensor-core kernel's instantiations by head-dim
// bucket, its split-count rule, and the launch of either attention kernel followed by the combine.
// Shared by kv_cache.cu (the library entry) and bench/cpp/kv_cache_decode_timing.cu, which times
// both kernels on the same inputs.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/kv_cache_kernels.cuh"
#include "cuda/kv_cache_mma.cuh"

namespace fmha::cuda::kv_cache {

// Index of a head-dim bucket (64, 128, 256) in per-bucket tables.
inline int bucket_index(int bucket) {
  return bucket <= 64 ? 0 : (bucket <= 128 ? 1 : 2);
}

// Calls f(kernel) with the tensor-core kernel of a bucket and a row-tile count (the library's
// tile keys, mma_tile_keys), so that every instantiation is named in one place.
template <typename T, typename F>
cudaError_t with_mma_kernel(int bucket, int row_tiles, F&& f) {
  auto pick = [&](auto bucket_c) {
    constexpr int kB = decltype(bucket_c)::value;
    constexpr int kKeys = mma_tile_keys(kB);
    if constexpr (mma_row_tiles(1, kB) == 1) {
      if (row_tiles <= 1) return f(kv_cache_mma_kernel<T, kB, 1, kKeys>);
    }
    if (row_tiles <= 2 || kB > 128) return f(kv_cache_mma_kernel<T, kB, 2, kKeys>);
    if constexpr (kB <= 128) return f(kv_cache_mma_kernel<T, kB, 4, kKeys>);
    return cudaErrorInvalidValue;
  };
  if (bucket <= 64) return pick(std::integral_constant<int, 64>{});
  if (bucket <= 128) return pick(std::integral_constant<int, 128>{});
  return pick(std::integral_constant<int, 256>{});
}

// Lets every instantiation of the tensor-core kernel take up to `max_shared` bytes of dynamic
// shared memory (the device's opt-in limit). Once per device: the attribute is per device context.
template <typename T>
cudaError_t allow_mma_shared(int max_shared) {
  cudaError_t e = cudaSuccess;
  for (int bucket : {64, 128, 256}) {
    for (int row_tiles : {1, 2, 4}) {
      if (e != cudaSuccess || (bucket > 128 && row_tiles > 2)) continue;
      e = with_mma_kernel<T>(bucket, row_tiles, [&](auto kernel) {
        return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    max_shared);
      });
    }
  }
  return e;
}

// Registers per thread of the tensor-core kernel of one bucket with four row tiles (two at 256),
// its largest form (the fp16 and bf16 forms compile alike; the fp16 one is asked).
inline cudaError_t mma_registers(int bucket, int* registers) {
  cudaFuncAttributes a{};
  const cudaError_t e = with_mma_kernel<__half>(
      bucket, 4, [&](auto kernel) { return cudaFuncGetAttributes(&a, kernel); });
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

// Key splits of the tensor-core kernel: `blocks` (sequence, kv head, row tiles) blocks of up to
// `capacity` keys each, on `resident` block slots (SMs x blocks per SM), in tiles of `tile_keys`.
// Every block of a split streams its keys at about the same rate, so the time goes as waves x (keys
// a split reads + a fixed cost per split, counted as two tiles of keys: the pipeline's fill, the
// epilogue, the combine's share); the rule takes the count of least time, the smaller on a tie
// (less workspace, a cheaper combine), with each split keeping whole key tiles, at least 64 keys
// (two tiles at bucket 256, one above). At B 1, Hkv 8, L 128k on 132 SMs with two blocks each it
// gives 33 splits: 264 blocks, one wave. At MQA B 1 L 4096 D 128 (one block a split) it gives 64
// splits of one tile: 0.027 ms on an H200 against 0.030 at 32 splits of two (2026-11-28).
inline constexpr int kMinSplitKeys = 64;
inline int split_rule(std::int64_t blocks, std::int64_t capacity, std::int64_t resident,
                      int tile_keys) {
  blocks = std::max<std::int64_t>(blocks, 1);
  resident = std::max<std::int64_t>(resident, 1);
  const std::int64_t split_keys =
      (std::max(kMinSplitKeys, tile_keys) + tile_keys - 1) / tile_keys * tile_keys;
  const std::int64_t limit =
      std::clamp<std::int64_t>((capacity + split_keys - 1) / split_keys, 1, kMaxSplits);
  int best = 1;
  double best_cost = 0.0;
  for (std::int64_t s = 1; s <= limit; ++s) {
    const std::int64_t waves = (blocks * s + resident - 1) / resident;
    const std::int64_t keys = ((capacity + s - 1) / s + tile_keys - 1) / tile_keys * tile_keys;
    const double cost = static_cast<double>(waves) * static_cast<double>(keys + 2 * tile_keys);
    if (s == 1 || cost < best_cost) {
      best = static_cast<int>(s);
      best_cost = cost;
    }
  }
  return best;
}

// Blocks of the tensor-core kernel's grid: batch x kv heads x the blocks a (sequence, kv head)'s
// row tiles need.
inline std::int64_t mma_grid_blocks(const KvCacheKernelParams& k, int block_row_tiles) {
  return static_cast<std::int64_t>(k.batch) * k.kv_heads *
         ((k.row_tiles + block_row_tiles - 1) / block_row_tiles);
}

// One attention call: the tensor-core kernel when `mma_stages` > 0 (with `shared` bytes, from
// mma_layout with the row tiles mma_row_tiles gives), else the CUDA-core kernel (`shared` from
// shared_layout); then, with several splits, the combine (`overlap_combine`: launched to overlap
// the attention kernel's end, sm90 and newer).
template <typename T>
cudaError_t launch_attention(const KvCacheKernelParams& k, int mma_stages, int shared,
                             cudaStream_t stream, bool overlap_combine = false) {
  cudaError_t e = cudaSuccess;
  if (mma_stages > 0) {
    const int bucket = mma_bucket(k.head_dim, k.value_dim);
    const int row_tiles = mma_row_tiles(k.row_tiles, bucket);
    const dim3 grid(static_cast<unsigned>(mma_grid_blocks(k, row_tiles)), k.num_splits);
    e = with_mma_kernel<T>(bucket, row_tiles, [&](auto kernel) {
      kernel<<<grid, kMmaThreads, shared, stream>>>(k, mma_stages);
      return cudaGetLastError();
    });
  } else {
    const dim3 grid(static_cast<unsigned>(k.batch) * k.kv_heads * k.row_tiles, k.num_splits);
    kv_cache_attention_kernel<T><<<grid, kThreads, shared, stream>>>(k);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess || k.num_splits <= 1) return e;
  return launch_combine<T>(k, stream, overlap_combine);
}

}  // namespace fmha::cuda::kv_cache
