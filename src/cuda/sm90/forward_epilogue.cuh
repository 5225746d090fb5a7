// The sm90 forward's epilogue (mainloop_fwd.cuh): a warp's 16 output rows, normalised, staged in
// its own rows of a shared-memory tile, then stored to global memory in 16-byte chunks (each
// thread storing its accumulator pairs itself cost 9.5% at D 128 L 8192: H200, 2026-11-26,
// docs/perf-log.md), or, where the output has a tile of its own and a tensor map, by one bulk
// tensor store a warp (tile_copies.cuh: tma_store_rows), which the math warps do not wait for:
// the threads' stores held them 4-6.5% of a short forward's time (H200, 2026-11-29, L 512). Where
// the output has no tile (D 256), a warp's rows may leave a 64-column block at a time through two
// chunks of its own (forward_smem.cuh: output_chunks).
#pragma once

#include <cstdint>

#include "cuda/common/forward_params.h"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm90/tile_copies.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace fmha::cuda::sm90 {

// Writes this thread's accumulator entries of n-tiles first_tile .. first_tile + kTiles - 1 (m16n8
// C layout, rows lane / 4 and + 8 of the warp's 16), times the rows' factors, as 16-bit pairs into
// the swizzled Tile at shared address `tile`: rows from first_row, columns from 0. Each 32-bit
// store of the warp falls in its own bank (the swizzle's chunk XOR row).
template <typename T, typename Tile, int kTiles, int kOutTiles>
__device__ __forceinline__ void stage_output_tiles(const float (&o)[kOutTiles][4],
                                                   const float (&factor)[2], std::uint32_t tile,
                                                   int first_row, int first_tile, int lane) {
  using Convert = tile::Dtype<T>;
  const int col = 2 * (lane % 4);
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int t = first_tile + j;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = first_row + lane / 4 + 8 * r;
      const std::uint32_t packed =
          Convert::pack(o[t][2 * r] * factor[r], o[t][2 * r + 1] * factor[r]);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(tile + Tile::chunk_offset(row, j) + col * 2),
                   "r"(packed)
                   : "memory");
    }
  }
}

// The warp's 16 rows, every n-tile, into its rows of the output tile from `first_row`.
template <typename T, typename Tile, int kOutTiles>
__device__ __forceinline__ void stage_output_rows(const float (&o)[kOutTiles][4],
                                                  const float (&factor)[2], std::uint32_t tile,
                                                  int first_row, int lane) {
  stage_output_tiles<T, Tile, kOutTiles>(o, factor, tile, first_row, 0, lane);
}

// A warp's 16 output rows (tile rows from `row` of head `head`, batch `batch`) through its
// kChunks swizzled 16 x 64 chunks at shared address `chunks` (generic: `chunks_ptr`): column
// block c is staged in chunk c % kChunks once the bulk store of the block kChunks before (or the
// previous grid tile's stores) has read it, then lane 0 stores it by TMA, in its bulk group, and
// the warp goes on. Columns at or past `cols` are neither staged nor stored.
template <typename T, typename Chunk, int kChunks, int kOutTiles>
__device__ __forceinline__ void store_output_by_chunks(const float (&o)[kOutTiles][4],
                                                       const float (&factor)[2],
                                                       std::uint32_t chunks,
                                                       const std::uint8_t* chunks_ptr,
                                                       const RowsMap& map, std::int64_t row,
                                                       int head, std::int64_t batch, int cols,
                                                       int lane) {
  static_assert(kChunks >= 2, "a block staged while the one before is stored");
#pragma unroll
  for (int c = 0; c < kOutTiles * 8 / Chunk::kBlockCols; ++c) {
    if (c * Chunk::kBlockCols >= cols) break;
    if (lane == 0) {
      if (c == 0) {
        ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<0>{});
      } else if (c >= kChunks) {
        ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<kChunks - 1>{});
      }
    }
    __syncwarp();
    const int offset = (c % kChunks) * Chunk::kBytes;
    static_assert(Chunk::kBytes == Chunk::kBlockBytes, "a chunk is one column block");
    stage_output_tiles<T, Chunk, Chunk::kBlockCols / 8>(o, factor, chunks + offset, 0,
                                                        c * Chunk::kBlockCols / 8, lane);
    fence_proxy_async();  // the lanes' stores made visible to the bulk copy
    __syncwarp();
    if (lane == 0) {
      tma_store_rows<Chunk>(chunks_ptr + offset, map, row, head, batch, cols,
                            c * Chunk::kBlockCols);
      ::cuda::ptx::cp_async_bulk_commit_group();
    }
  }
}

// Stores the warp's staged rows (tile rows first_row .. + 15 of the Tile at `staged_tile`, the
// generic address of the staging tile) to `out`: rows that exist (warp_rows of them), columns
// below the value dim. Row r goes to out row r, or with token tiles to out row
// query_token[first_row + r] (out then starts at token 0; -1: not stored).
template <int kD, bool kTokenTiles, typename Tile>
__device__ __forceinline__ void store_output_rows(const ForwardParams& p, std::uint16_t* out,
                                                  const std::uint8_t* staged_tile, int first_row,
                                                  int warp_rows, const int* query_token, int lane) {
  constexpr int kChunks = kD / 8;
  for (int index = lane; index < 16 * kChunks; index += 32) {
    const int r = index / kChunks;
    const int c = index % kChunks;
    if (r >= warp_rows || c * 8 >= p.value_dim) continue;
    std::int64_t dst_row = r;
    if constexpr (kTokenTiles) {
      dst_row = query_token[first_row + r];
      if (dst_row < 0) continue;
    }
    const std::uint8_t* staged = staged_tile + Tile::chunk_offset(first_row + r, c);
    if (p.vector_stores) {
      *reinterpret_cast<uint4*>(out + dst_row * p.out_row_stride + c * 8) =
          *reinterpret_cast<const uint4*>(staged);
    } else {
      const auto* x = reinterpret_cast<const std::uint16_t*>(staged);
      for (int e = 0; e < 8 && c * 8 + e < p.value_dim; ++e)
        out[dst_row * p.out_row_stride + c * 8 + e] = x[e];
    }
  }
}

}  // namespace fmha::cuda::sm90
