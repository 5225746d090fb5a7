// Tile-size choices of the sm90 (wgmma) backward kernels, one place, each with its reason.
// The split structure only (a dK/dV kernel and a dQ kernel, no atomics): every product keeps its
// accumulator in registers, and each kernel is the forward's loop with one more product.
#pragma once

namespace fmha::cuda::sm90 {

// Head-dim buckets the sm90 backward takes: its two gradient accumulators (dK and dV of 64 keys,
// D / 2 floats a thread each) plus two score tiles fit the 255 registers a thread only up to
// D = 128; larger heads run the sm80 backward.
inline constexpr int kBwdMaxHeadDim = 128;

// Both kernels: two warpgroups (256 threads), each owning 64 rows of the block's own side.
inline constexpr int kBwdThreads = 256;

// dK/dV kernel: 128 keys per block (64 per warpgroup: the A operand of S^T = K Q^T and
// dP^T = V dO^T), walking query tiles (the N of those products and the K of dV += P^T dO,
// dK += dS^T Q): 64 queries, 96 up to D = 64, where dK and dV leave registers for wider score
// tiles (fewer barriers and statistics loads per product).
inline constexpr int kBwdKeysPerBlock = 128;
constexpr int bwd_queries_per_tile(int head_dim_bucket) {
  return head_dim_bucket <= 64 ? 96 : 64;
}

// dQ kernel: 128 queries per block (64 per warpgroup), walking key tiles: S and dP cost N / 2
// floats a thread each next to the D / 2 of dQ: 64 keys, 128 up to D = 64.
inline constexpr int kBwdQueriesPerBlock = 128;
constexpr int bwd_keys_per_tile(int head_dim_bucket) {
  return head_dim_bucket <= 64 ? 128 : 64;
}

inline constexpr int kBwdStages = 3;

}  // namespace fmha::cuda::sm90
