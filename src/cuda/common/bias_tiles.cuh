// Staged bias tiles: rows x keys of a 16-bit bias copied to shared memory with 16-byte cp.async,
// for the general policy's kernels, which read the bias once per block (forward, dQ) or in another
// layout than their accumulators' rows (the dK/dV kernel's transposed scores). Layout
// (tile_sizes.h bias_tile_bytes, tile_sizes_bwd.h): row r of kCols 16-bit values, its 16-byte
// chunk c at chunk swizzled_chunk(c, r), so that the 8 rows x 4 pair loads of a warp's fragment,
// and the 8 rows of a transposing ldmatrix, fall in distinct banks. The bias policy's sm90 kernels
// stage theirs as K-major SwizzledTiles (sm90/wgmma.cuh), the layout a TMA copy writes, and read
// them transposed through add_transposed as well.
#pragma once

#include <cstdint>

#include "cuda/common/online_softmax.cuh"
#include "cuda/common/tile_primitives.cuh"

namespace fmha::cuda::bias_tiles {

// Row r's 16-byte chunk c sits at chunk c ^ (r mod 8) of the row (mod the row's chunk count when
// it has fewer than 8, so that it stays in its row).
template <int kChunks>
__device__ __forceinline__ int swizzled_chunk(int c, int r) {
  return c ^ (r & ((kChunks < 8 ? kChunks : 8) - 1));
}

// Copies the bias of rows [first_row, +kRows) x keys [first_key, +kCols) (rows of `bias`
// row_stride elements apart, keys contiguous, 16-byte aligned, Lk % 8 == 0) to shared address
// `dst`, zeros past the sequence. Every thread of the block calls it.
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_async(std::uint32_t dst, const std::uint16_t* bias,
                                           std::int64_t row_stride, std::int64_t first_row,
                                           std::int64_t first_key, std::int64_t num_queries,
                                           std::int64_t num_keys) {
  constexpr int kChunks = kCols / 8;
  constexpr int kRowStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kRowStep == 0, "whole rows per pass");
  const int c = static_cast<int>(threadIdx.x) % kChunks;
  const int r0 = static_cast<int>(threadIdx.x) / kChunks;
  const std::int64_t j = first_key + 8 * c;
#pragma unroll
  for (int it = 0; it < kRows / kRowStep; ++it) {
    const int r = r0 + it * kRowStep;
    const std::int64_t i = first_row + r;
    const bool inside = i < num_queries && j < num_keys;  // Lk % 8 == 0: whole chunks
    const std::uint16_t* src = inside ? bias + i * row_stride + j : bias;
    tile::cp_async_16(dst + r * kCols * 2 + (swizzled_chunk<kChunks>(c, r) << 4), src,
                      inside ? 16 : 0);
  }
}

// The shared address of row r's 16-byte chunk c in this file's layout of a tile of kCols keys at
// shared address `tile`.
template <int kCols>
struct ChunkOf {
  std::uint32_t tile;
  __device__ __forceinline__ std::uint32_t operator()(int r, int c) const {
    return tile + r * kCols * 2 + (swizzled_chunk<kCols / 8>(c, r) << 4);
  }
};

// The bias of transposed score tiles (rows = keys, columns = queries; the sm90 dK/dV kernel's
// S^T) from a staged tile of query rows x keys, whose row r's 16-byte chunk c (keys 8c .. 8c + 7)
// is at shared address chunk(r, c) (ChunkOf, this file's layout; or a K-major SwizzledTile of
// sm90/wgmma.cuh, which a TMA copy writes): this warp's 16 keys start at tile key `first_key`;
// entries 0, 1 of tile t on queries 8t + 2 (lane % 4) + {0, 1}, entries 2, 3 eight keys further.
// One transposing ldmatrix gives two tiles' pairs: its 8 x 8 matrices are (query tile, key half),
// and a thread's register of a transposed matrix holds rows 2 (lane % 4), + 1 of column lane / 4,
// i.e. its own entries. Both layouts put a matrix's 8 rows in 8 swizzle phases: no bank conflicts.
// Each score becomes combine(score, bias value); rows past the sequence read the staged zeros.
template <typename T, int kTiles, typename ChunkAddress, typename Combine>
__device__ __forceinline__ void add_transposed(float (&s)[kTiles][4], const ChunkAddress& chunk,
                                               int first_key, int lane, Combine combine) {
  using Convert = tile::Dtype<T>;
  static_assert(kTiles % 2 == 0, "two query tiles per ldmatrix");
  const int m = lane / 8;                 // the matrix this lane addresses a row of
  const int c = first_key / 8 + (m & 1);  // key half
#pragma unroll
  for (int t = 0; t < kTiles; t += 2) {
    const int r = (t + m / 2) * 8 + lane % 8;  // query row of the tile
    std::uint32_t x[4];
    tile::ldmatrix_x4_trans(x, chunk(r, c));
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // matrix i: query tile t + i / 2, key half i % 2
      float(&st)[4] = s[t + i / 2];
      st[2 * (i & 1)] =
          combine(st[2 * (i & 1)], Convert::to_float(static_cast<std::uint16_t>(x[i])));
      st[2 * (i & 1) + 1] =
          combine(st[2 * (i & 1) + 1], Convert::to_float(static_cast<std::uint16_t>(x[i] >> 16)));
    }
  }
}

}  // namespace fmha::cuda::bias_tiles
