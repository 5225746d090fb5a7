// Tile-size choices of the sm80 (mma.sync) backward kernels, one place, each with its reason.
// Head-dim buckets, the thread count, the shared-memory row padding and the dQ kernel's tiles are
// the forward's (tile_sizes.h): the dQ kernel is the forward's loop with dS in place of P.
#pragma once

#include "cuda/sm80/tile_sizes.h"

namespace fmha::cuda::sm80 {

// dK/dV kernel: one block owns kBwdBlockN keys, 16 per warp, and keeps dK and dV of its keys in
// registers while it walks the query tiles that see them. Each warp is the A operand (rows) of
// every product that produces its keys' gradients: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO,
// dK += dS^T Q, so no cross-warp reduction is needed for dK/dV.
inline constexpr int kBwdBlockN = kWarps * 16;

// Accumulator columns per block: dK and dV of 16 keys x C columns cost C floats a thread, so C is
// capped at 128 (128 + 128 registers would spill). Buckets above 128 run as two column chunks in
// two blocks that both recompute S and dP (2 of the 5 products) and each own half of dK/dV/dQ:
// about 40% more tensor-core work at D = 256, instead of spills or a shared-memory accumulator.
// fp32 caps C at 64: its split operand fragments (hi and lo) take the registers a wider chunk
// would need.
template <typename T>
constexpr int bwd_max_chunk() {
  return elem_bytes<T>() == 4 ? 64 : 128;
}
template <typename T>
constexpr int bwd_chunk(int head_dim_bucket) {
  return head_dim_bucket < bwd_max_chunk<T>() ? head_dim_bucket : bwd_max_chunk<T>();
}

// Column chunks (blocks per key tile) of a problem whose larger head dim is `max_dim`.
template <typename T>
constexpr int bwd_num_chunks(int head_dim_bucket, int max_dim) {
  return (max_dim + bwd_chunk<T>(head_dim_bucket) - 1) / bwd_chunk<T>(head_dim_bucket);
}

// Query rows per step of the dK/dV kernel. The score tile S^T (16 keys x M queries) costs M / 2
// registers a thread twice over (P and dP), next to the kC-column dK/dV accumulators. 64 rows for
// bucket 32; 32 from bucket 64 on; 16 at 256, so that Q, dO, K, V and dS tiles fit in the 99 KB
// that sm86/sm89 allow a block. Measured on an H100 (fp16, 2026-11-23, both variants passing
// the GPU tests): bucket 64 with 32 rows (no spills) instead of 64 rows (160 spilled bytes) is
// 10-22% faster; bucket 128 with 16 rows (no spills) instead of 32 (80 spilled bytes) is 4-6%
// slower (more barriers and K/V fragment reloads per product), so 128 keeps 32.
// fp32: 64 / 32 up to bucket 96, 16 above (shared memory: K and V alone are 64 rows of D floats).
template <typename T>
constexpr int bwd_block_m(int head_dim_bucket) {
  if (elem_bytes<T>() == 4) return head_dim_bucket <= 32 ? 64 : (head_dim_bucket <= 96 ? 32 : 16);
  return head_dim_bucket <= 32 ? 64 : (head_dim_bucket < 256 ? 32 : 16);
}

// dS^T staged for the fused dQ product, [kBwdBlockN keys][M queries], rows padded like the others.
template <typename T>
constexpr int bwd_ds_row(int head_dim_bucket) {
  return bwd_block_m<T>(head_dim_bucket) + kSmemPadBytes / elem_bytes<T>();
}

// fp32 up to bucket 64: K and V, read by every query step, are split once for the exact mode's
// products (tile_operands.cuh's split_tile_in_place) into planes of their own after V, the most
// that keeps the kernel within the 99 KB of sm86/sm89 (96.5 KB at bucket 64). Measured on an
// H200 (bench/cpp/sm80_fp32_timing.cu, 2026-11-26): see docs/perf-log.md.
template <typename T>
constexpr bool bwd_presplit_kv(int head_dim_bucket) {
  return elem_bytes<T>() == 4 && head_dim_bucket <= 64;
}

// Q, dO (M rows each), K, V (kBwdBlockN rows each; twice with bwd_presplit_kv), dS^T, and the
// per-row lse and Delta (floats).
template <typename T>
constexpr int bwd_dkdv_smem_bytes(int head_dim_bucket) {
  const int kv_tiles = bwd_presplit_kv<T>(head_dim_bucket) ? 4 : 2;
  return ((2 * bwd_block_m<T>(head_dim_bucket) + kv_tiles * kBwdBlockN) *
              smem_row<T>(head_dim_bucket) +
          kBwdBlockN * bwd_ds_row<T>(head_dim_bucket)) *
             elem_bytes<T>() +
         2 * bwd_block_m<T>(head_dim_bucket) * 4;
}

// dQ kernel: Q, dO (kBlockM rows), K, V (dq_block_n rows); single-buffered. Its key tiles are the
// forward's for 16-bit types; fp32 halves them again from bucket 96 on (Q and dO are two 64-row
// tiles here, one in the forward).
template <typename T>
constexpr int dq_block_n(int head_dim_bucket) {
  if (elem_bytes<T>() == 4) return head_dim_bucket <= 64 ? 64 : (head_dim_bucket <= 96 ? 32 : 16);
  return block_n<T>(head_dim_bucket);
}
template <typename T>
constexpr int bwd_dq_smem_bytes(int head_dim_bucket) {
  return (2 * kBlockM + 2 * dq_block_n<T>(head_dim_bucket)) * smem_row<T>(head_dim_bucket) *
         elem_bytes<T>();
}

// 16-bit: every bucket within the 99 KB of sm86/sm89. fp32 buckets above 128 need more (K and V
// of 64 keys alone are 64 KB at D = 128): they opt in to what sm80 (163 KB) and sm90 (227 KB)
// allow, and the launch refuses them with a message on GPUs that allow less.
static_assert(bwd_dkdv_smem_bytes<short>(kMaxHeadDim) <= kPortableSmemBytes, "99 KB per block");
static_assert(bwd_dkdv_smem_bytes<short>(224) <= kPortableSmemBytes, "99 KB per block");
static_assert(bwd_dq_smem_bytes<short>(kMaxHeadDim) <= kPortableSmemBytes, "99 KB per block");
static_assert(bwd_dq_smem_bytes<short>(128) <= kPortableSmemBytes, "99 KB per block");
static_assert(bwd_dkdv_smem_bytes<float>(128) <= kPortableSmemBytes, "99 KB per block");
static_assert(bwd_dkdv_smem_bytes<float>(64) <= kPortableSmemBytes, "99 KB per block");
static_assert(bwd_dq_smem_bytes<float>(128) <= kPortableSmemBytes, "99 KB per block");
static_assert(bwd_dkdv_smem_bytes<float>(kMaxHeadDim) <= kMaxSmemBytes, "227 KB per block");
static_assert(bwd_dq_smem_bytes<float>(kMaxHeadDim) <= kMaxSmemBytes, "227 KB per block");

}  // namespace fmha::cuda::sm80
