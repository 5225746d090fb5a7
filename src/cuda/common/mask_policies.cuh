// Mask policies. A policy whose rows and keys are ranges of the sequence (kTokenTiles false)
// answers three questions for a block of query rows [first_row, last_row]:
//   key_range(): the keys that any of those rows can see (tiles outside it are skipped),
//   tile_is_full(): whether every row sees every key of a tile (the hot loop then runs unmasked),
//   visible(i, j): the per-element answer, used only on partial tiles.
// Ragged tails (keys past Lk) are partial tiles of every policy, so no policy needs a
// compile-time flag for them. Window sizes and the alignment are runtime values. A policy with
// kTokenTiles true (neighborhood_mask.cuh) instead gathers a block's rows and each key tile's
// keys by token; the kernels resolve the flag at compile time, so the range policies keep their
// code.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/forward_params.h"

namespace fmha::cuda {

struct KeyRange {
  std::int64_t begin, end;  // [begin, end); empty when end <= begin
};

// Every key of the sequence is visible.
struct MaskNone {
  static constexpr bool kTokenTiles = false;  // rows and keys are ranges of the sequence
  std::int64_t num_keys;

  __device__ static MaskNone make(const ForwardParams&, std::int64_t, std::int64_t num_keys) {
    return {num_keys};
  }
  __device__ KeyRange key_range(std::int64_t, std::int64_t) const { return {0, num_keys}; }
  __device__ bool tile_is_full(std::int64_t, std::int64_t, std::int64_t first_key,
                               int tile_keys) const {
    return first_key + tile_keys <= num_keys;
  }
  __device__ bool visible(std::int64_t, std::int64_t j) const { return j < num_keys; }
};

// Causal and sliding windows (SPEC §3): d(i) - left <= j <= d(i) + right with d(i) = i + offset.
// Causal is the window (unbounded, 0); the host folds both into one (left, right) pair.
struct MaskWindow {
  static constexpr bool kTokenTiles = false;
  std::int64_t num_keys;
  std::int64_t offset;  // 0 (top-left) or Lk - Lq (bottom-right)
  std::int64_t left, right;

  __device__ static MaskWindow make(const ForwardParams& p, std::int64_t num_queries,
                                    std::int64_t num_keys) {
    return {num_keys, p.bottom_right ? num_keys - num_queries : 0, p.window_left, p.window_right};
  }
  // Both bounds grow with i, so the union over the block's rows is [lo(first), hi(last)].
  __device__ KeyRange key_range(std::int64_t first_row, std::int64_t last_row) const {
    const std::int64_t lo = first_row + offset - left;
    const std::int64_t hi = last_row + offset + right + 1;
    return {lo > 0 ? lo : 0, hi < num_keys ? hi : num_keys};
  }
  __device__ bool tile_is_full(std::int64_t first_row, std::int64_t last_row,
                               std::int64_t first_key, int tile_keys) const {
    const std::int64_t last_key = first_key + tile_keys - 1;
    return last_key < num_keys && last_row + offset - left <= first_key &&
           last_key <= first_row + offset + right;
  }
  __device__ bool visible(std::int64_t i, std::int64_t j) const {
    const std::int64_t d = i + offset;
    return j < num_keys && j >= d - left && j <= d + right;
  }
};

// Sets to -inf the scores a mask hides in a warp's m16n8 accumulator tiles: this thread's entries
// 0, 1 sit on `row`, entries 2, 3 on row + 8; entry 0 of tile t is at column col + 8t. Run only on
// partial tiles, so the per-element 64-bit comparisons stay off the hot path.
template <typename Mask, int kTiles>
__device__ __forceinline__ void hide_invisible(const Mask& mask, float (&s)[kTiles][4],
                                               std::int64_t row, std::int64_t col) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (!mask.visible(row + (e >= 2 ? 8 : 0), col + t * 8 + (e & 1))) s[t][e] = -INFINITY;
    }
  }
}

}  // namespace fmha::cuda
