// Tile-size choices of the sm80 (mma.sync) forward kernel, one place, each with its reason.
#pragma once

namespace fmha::cuda::sm80 {

// Head-dim buckets: a problem runs in the smallest bucket >= max(D, Dv); columns past D / Dv are
// zero-filled on load, skipped in the products 16 at a time, and never stored.
// Multiples of 32 keep every common head dim close to its bucket (SAM's 80 runs as 96, not 128;
// 40 as 64, 72 as 96, 200 as 224) while holding the instantiation count, and so the build, to
// 8 buckets. A 16-granular set would halve the waste of the worst cases (e.g. 80 -> 80) at twice
// the compile time; powers of two would run D = 80 and 96 as 128 (up to 60% wasted MMA work).
inline constexpr int kHeadDimBucketStep = 32;
inline constexpr int kMaxHeadDim = 256;

constexpr int head_dim_bucket(int head_dim) {
  return (head_dim + kHeadDimBucketStep - 1) / kHeadDimBucketStep * kHeadDimBucketStep;
}

// 4 warps, each owning 16 query rows (one m16 MMA row block): a block covers 64 queries. Fewer
// rows per block keeps the grid large for short sequences and the per-thread output accumulator
// at Dv/2 floats (128 at Dv = 256), which fits in registers without spills.
// Not tried yet: 8 warps / 128 rows for D <= 64 (FlashAttention-2's choice there), which
// halves K/V shared-memory traffic per query.
inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kBlockM = kWarps * 16;

// Keys per tile: 64 up to D = 128; 32 above, where the score tile (kBlockN / 2 floats a thread)
// would otherwise push the 256-bucket past 255 registers, and where the K/V tiles would push
// shared memory past what two blocks per SM can share on an A100.
constexpr int block_n(int head_dim_bucket) { return head_dim_bucket <= 128 ? 64 : 32; }

// Shared-memory rows are padded by 8 elements (16 bytes) so that the 8 row addresses of one
// ldmatrix land in 8 different 16-byte bank groups (no conflicts) without a swizzle.
inline constexpr int kSmemPad = 8;
constexpr int smem_row(int head_dim_bucket) { return head_dim_bucket + kSmemPad; }

// One Q tile, one K tile and one V tile, 16-bit elements: K of tile t + 1 loads while P.V of
// tile t runs, V of tile t while Q.K of tile t runs. The output tile reuses Q's rows.
constexpr int smem_bytes(int head_dim_bucket) {
  return (kBlockM + 2 * block_n(head_dim_bucket)) * smem_row(head_dim_bucket) * 2;
}

static_assert(smem_bytes(kMaxHeadDim) <= 99 * 1024, "sm86/sm89 allow at most 99 KB per block");

}  // namespace fmha::cuda::sm80
