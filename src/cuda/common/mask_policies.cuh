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

// The tiles of `tile` rows that cover the rows [begin, end) of a range mask (keys of a block of
// queries, or queries of a block of keys): the first starts at `begin` rounded down to 8 rows (the
// staged 16-bit tiles and fp32 statistics keep 16-byte rows), not to a whole tile, so a band of w
// rows takes ceil(w / tile) tiles and not one more whenever it straddles a multiple of `tile`.
struct TileSpan {
  std::int64_t first_row, count;  // count 0 when end <= begin
};
__host__ __device__ inline TileSpan tiles_over(std::int64_t begin, std::int64_t end, int tile) {
  if (end <= begin) return {0, 0};
  const std::int64_t first = begin / 8 * 8;
  return {first, (end - first + tile - 1) / tile};
}

// The queries that see one key, as an inclusive interval (the backward's transposed question);
// bounds may lie far outside the sequence, callers clip them.
struct KeySeenBy {
  std::int64_t first, last;
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
// Neighborhood attention on one axis without dilation runs as this window too (neighborhood.cu),
// with `shifts` set: the window keeps its width left + right + 1 at the sequence's borders by
// shifting inward, i.e. its first key d(i) - left is clamped to [0, Lk - width] (SPEC §6). Either
// way both bounds are non-decreasing in i.
struct MaskWindow {
  static constexpr bool kTokenTiles = false;
  std::int64_t num_keys;
  std::int64_t offset;  // 0 (top-left) or Lk - Lq (bottom-right)
  std::int64_t left, right;
  bool shifts;  // neighborhood borders: both sides finite, width <= Lk

  __host__ __device__ static MaskWindow make(const ForwardParams& p, std::int64_t num_queries,
                                             std::int64_t num_keys) {
    return {num_keys, p.bottom_right ? num_keys - num_queries : 0, p.window_left, p.window_right,
            p.window_shifts_at_borders};
  }
  // The first and last key row i sees, before clipping to [0, Lk).
  __host__ __device__ std::int64_t first_seen(std::int64_t i) const {
    const std::int64_t first = i + offset - left;
    if (!shifts) return first;
    const std::int64_t last_start = num_keys - (left + right + 1);
    return first < 0 ? 0 : (first > last_start ? last_start : first);
  }
  __host__ __device__ std::int64_t last_seen(std::int64_t i) const {
    return shifts ? first_seen(i) + left + right : i + offset + right;
  }
  // Both bounds grow with i, so the union over the block's rows is [lo(first), hi(last)].
  __host__ __device__ KeyRange key_range(std::int64_t first_row, std::int64_t last_row) const {
    const std::int64_t lo = first_seen(first_row);
    const std::int64_t hi = last_seen(last_row) + 1;
    return {lo > 0 ? lo : 0, hi < num_keys ? hi : num_keys};
  }
  __host__ __device__ bool tile_is_full(std::int64_t first_row, std::int64_t last_row,
                                        std::int64_t first_key, int tile_keys) const {
    const std::int64_t last_key = first_key + tile_keys - 1;
    return last_key < num_keys && first_seen(last_row) <= first_key &&
           last_key <= last_seen(first_row);
  }
  __host__ __device__ bool visible(std::int64_t i, std::int64_t j) const {
    return j < num_keys && j >= first_seen(i) && j <= last_seen(i);
  }
  // Transposed: visible iff j - offset - right <= i <= j - offset + left. With the border shift a
  // window still ends at or after j iff it starts at or after j - left - right, which every
  // window does when j - left - right <= 0; and every window starts at or before j when
  // j >= Lk - width. Both bounds grow with j.
  __host__ __device__ KeySeenBy seen_by(std::int64_t j) const {
    KeySeenBy q{j - offset - right, j - offset + left};
    if (shifts) {
      if (j - left - right <= 0) q.first = -kUnboundedWindow;
      if (j >= num_keys - (left + right + 1)) q.last = kUnboundedWindow;
    }
    return q;
  }
};

// Inclusive interval of offsets in a tile; empty when lo > hi.
struct TileBounds {
  int lo, hi;
  __host__ __device__ bool contains(int x) const { return x >= lo && x <= hi; }
  // Offsets 0 .. count - 1 (extra keys: every query sees each one that exists).
  __host__ __device__ static TileBounds prefix(int count) { return {0, count - 1}; }
};

__host__ __device__ inline TileBounds clamp_bounds(std::int64_t lo, std::int64_t hi, int tile) {
  return {static_cast<int>(lo < 0 ? 0 : (lo > tile ? tile : lo)),
          static_cast<int>(hi < -1 ? -1 : (hi >= tile ? tile - 1 : hi))};
}

// Offsets c in [0, tile) for which query i sees key first_key + c.
__host__ __device__ inline TileBounds visible_keys(const MaskNone& m, std::int64_t,
                                                   std::int64_t first_key, int tile) {
  return clamp_bounds(0, m.num_keys - 1 - first_key, tile);
}
__host__ __device__ inline TileBounds visible_keys(const MaskWindow& m, std::int64_t i,
                                                   std::int64_t first_key, int tile) {
  const std::int64_t last = m.last_seen(i);
  const std::int64_t hi = last < m.num_keys - 1 ? last : m.num_keys - 1;
  return clamp_bounds(m.first_seen(i) - first_key, hi - first_key, tile);
}

// Sets to -inf the scores a mask hides in a warp's m16n8 accumulator tiles: this thread's entries
// 0, 1 sit on `row`, entries 2, 3 on row + 8; entry 0 of tile t is at column col + 8t. Run only on
// partial tiles. Range masks answer once per row with the interval of visible columns (two int
// compares an element); token-tile masks per element.
template <typename Mask, int kTiles>
__device__ __forceinline__ void hide_invisible(const Mask& mask, float (&s)[kTiles][4],
                                               std::int64_t row, std::int64_t col) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    [[maybe_unused]] TileBounds cols{0, -1};
    if constexpr (!Mask::kTokenTiles) cols = visible_keys(mask, row + 8 * r, col, kTiles * 8);
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        bool seen;
        if constexpr (Mask::kTokenTiles) {
          seen = mask.visible(row + 8 * r, col + t * 8 + e);
        } else {
          seen = cols.contains(t * 8 + e);
        }
        if (!seen) s[t][2 * r + e] = -INFINITY;
      }
    }
  }
}

}  // namespace fmha::cuda
