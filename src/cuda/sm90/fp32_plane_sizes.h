// Tile sizes of the sm90 fp32 kernels and the sizes of their operand planes (fp32_planes.cuh), on
// the host side too: a call's workspace is sized from them before anything is launched
// (forward.cu, backward.cu).
#pragma once

#include <cstdint>

#include "cuda/common/forward_params.h"

namespace fmha::cuda::sm90 {

inline constexpr int kFp32PlaneWidth = 64;  // head dims up to 64, padded to it
inline constexpr int kFp32PlaneRowFloats = 2 * kFp32PlaneWidth;
inline constexpr int kFp32QueryTile = 128;  // forward: 64 rows a warpgroup
inline constexpr int kFp32KeyTile = 64;     // forward
// Backward: rows a block owns (keys in dK/dV, queries in dQ).
inline constexpr int kFp32BwdBlock = 64;

// x rounded up to a multiple of `to`: a plane's padded rows.
__host__ __device__ constexpr std::int64_t round_up(std::int64_t x, std::int64_t to) {
  return (x + to - 1) / to * to;
}

// Floats of one query-side plane and one key-side plane of a call: rows [rows, 128] a (batch,
// head) or a (batch, kv head), the rows padded to the kernels' tiles.
struct PlaneFloats {
  std::int64_t q, k;
};
inline PlaneFloats plane_floats(const ForwardParams& f, int query_tile, int key_tile) {
  return {f.batch * f.heads * round_up(f.seqlen_q, query_tile) * kFp32PlaneRowFloats,
          f.batch * (f.heads / f.kv_group) * round_up(f.seqlen_k, key_tile) * kFp32PlaneRowFloats};
}

// The forward's planes: Q, then the key-side K [rows, 128] and V^T [128, rows], one after another
// in the call's scratch memory.
inline PlaneFloats forward_plane_floats(const ForwardParams& f) {
  return plane_floats(f, kFp32QueryTile, kFp32KeyTile);
}
inline std::int64_t fp32_forward_planes_floats(const ForwardParams& f) {
  const PlaneFloats n = forward_plane_floats(f);
  return n.q + 2 * n.k;
}

// The backward's planes: four query-side (Q, dO, Q^T, dO^T) and three key-side (K, V, K^T).
inline PlaneFloats backward_plane_floats(const ForwardParams& f) {
  return plane_floats(f, kFp32BwdBlock, kFp32BwdBlock);
}
inline std::int64_t fp32_backward_planes_floats(const ForwardParams& f) {
  const PlaneFloats n = backward_plane_floats(f);
  return 4 * n.q + 3 * n.k;
}

}  // namespace fmha::cuda::sm90
