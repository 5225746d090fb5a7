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
// dP^T = V dO^T), walking query tiles of 64 (the N of those products and the K of dV += P^T dO,
// dK += dS^T Q). Three Q/dO stages.
inline constexpr int kBwdKeysPerBlock = 128;
inline constexpr int kBwdQueriesPerTile = 64;

// dQ kernel: 128 queries per block (64 per warpgroup), walking key tiles of 64: S and dP cost 32
// floats a thread each next to the D / 2 of dQ. Three K/V stages.
inline constexpr int kBwdQueriesPerBlock = 128;
inline constexpr int kBwdKeysPerTile = 64;

inline constexpr int kBwdStages = 3;

}  // namespace fmha::cuda::sm90
