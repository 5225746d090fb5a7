// The fp32 dQ accumulator of the warp-specialized fused backward (mainloop_bwd_fused.cuh), and the
// kernel that turns it into dq.
//
// Every key block of a head adds its share of dQ for each query tile it sees, so the sums meet in
// an fp32 buffer in global memory. Each math warpgroup holds a 64 x 64 piece of a query tile's dQ
// in the registers of a wgmma accumulator (D 128: all 64 queries x head-dim columns [64w, +64);
// D 64: queries [64w, +64) x all 64 columns). The buffer keeps that piece in the registers' own
// order, a "chunk" of 4096 floats: float4 number j * 128 + t of the chunk is thread t's
// accumulator tile j. So a warpgroup stages its piece with 16-byte shared-memory stores that no
// two threads of a quarter-warp send to the same bank, and the whole chunk goes to the buffer as
// one bulk reduction (cp.reduce.async.bulk .add.f32: the copy engine adds it in L2 while the block
// goes on), with no transposition anywhere. The conversion below undoes the order once, after the
// last block: dq = scale * dQ in q's dtype, staged row-major in shared memory for 16-byte stores.
//
// Layout: per (batch, head) a run of query tiles of kTileFloats each (both warpgroups' chunks),
// tile m0 / kM of a dense batch at m0 * kD floats; a varlen sequence's tiles start at
// padded_first_row (below) * kD of its head, so that whole tiles of two sequences never share
// floats.
#pragma once

#include <cstdint>

#include "cuda/common/backward_params.h"
#include "cuda/common/block_coords.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm90/tile_sizes_bwd.h"

namespace fmha::cuda::sm90 {

template <int kD>
struct DqAccumulator {
  static_assert(bwd_fused_ws_bucket(kD), "head-dim buckets 64 and 128");
  static constexpr int kM = bwd_fused_queries_per_tile(kD);
  static constexpr bool kSplitColumns = kD == 128;  // else the warpgroups split the queries
  static constexpr int kChunkFloats = 64 * 64;
  static constexpr int kTileFloats = kM * kD;
  static_assert(kTileFloats == 2 * kChunkFloats, "a chunk per math warpgroup");

  // Element e of accumulator tile j of thread t (0..127) of warpgroup w: its row (query of the
  // tile) and column (of the head dim), as the wgmma m64nNk16 accumulator lays them out.
  __host__ __device__ static int row_of(int w, int t, int e) {
    return (kSplitColumns ? 0 : 64 * w) + 16 * (t / 32) + (t % 32) / 4 + 8 * (e / 2);
  }
  __host__ __device__ static int col_of(int w, int t, int j, int e) {
    return (kSplitColumns ? 64 * w : 0) + 8 * j + 2 * (t % 4) + (e & 1);
  }

  // The first row of sequence b's tiles in its head's run: dense 0; varlen q_start rounded so
  // that consecutive sequences' tiles never overlap (q_start + b * kM grows by at least a tile
  // more than the previous sequence's length).
  __host__ __device__ static std::int64_t padded_first_row(std::int64_t q_start, std::int64_t b,
                                                           bool varlen) {
    return varlen ? (q_start + b * kM) / kM * kM : 0;
  }

  // Rows of a head's run: dense Lq rounded up to a tile; varlen enough for every sequence's
  // padded tiles.
  static std::int64_t rows_per_head(std::int64_t rows, std::int64_t batch, bool varlen) {
    return varlen ? (rows / kM + batch + 1) * kM : (rows + kM - 1) / kM * kM;
  }
};

// Strides of the accumulator in BackwardParams (floats): a head's run, and in a dense batch the
// batch's heads; outer = B (dense) or 1 (varlen), inner = Lq or total_q.
template <int kD>
inline void set_dq_accumulator_strides(BackwardParams* p, std::int64_t inner, bool varlen) {
  const std::int64_t head = DqAccumulator<kD>::rows_per_head(inner, p->fwd.batch, varlen) * kD;
  p->accum_head_stride = head;
  p->accum_batch_stride = varlen ? 0 : head * p->fwd.heads;
  p->accum_row_stride = kD;
  p->accum_col_stride = 1;
}

#ifdef __CUDACC__
// How dq's layout takes the conversion's stores: 16 bytes of 8 columns (whole 8-column groups,
// 16-byte aligned rows), or pairs of neighbouring columns as one 32-bit word, or elements.
enum class DqStores { kVectors, kPairs, kElements };

// dq = scale * dQ for the query tile blockIdx.x of head blockIdx.y, batch blockIdx.z. Thread t of
// half w reads chunk w's float4s j * 128 + t (coalesced). With kVectors the block packs them into
// a row-major copy of the tile in shared memory (rows padded by 4 words, so a warp's stores hit
// 32 banks) and stores each row in 16-byte pieces, whole 128-byte lines a warp; otherwise each
// thread stores the elements it holds (two rows of 8 x 2 columns), which spreads a warp's stores
// over 8 rows, 16 bytes in each.
template <typename T, int kD>
__global__ void __launch_bounds__(256)
    convert_dq_accumulator_kernel(const __grid_constant__ BackwardParams p, DqStores stores) {
  using Accum = DqAccumulator<kD>;
  using Storage = typename tile::Dtype<T>::Storage;
  constexpr int kWords = kD / 2 + 4;  // a staged row's 32-bit words
  __shared__ __align__(16) std::uint32_t staged[Accum::kM * kWords];
  const std::int64_t b = blockIdx.z;
  const int h = static_cast<int>(blockIdx.y);
  const SequenceRows rows = sequence_rows(p.fwd, b);
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.x) * Accum::kM;
  if (m0 >= rows.num_queries) return;
  const bool varlen = p.fwd.cu_seqlens_q != nullptr;
  const float* tile_base = p.dq_accum + b * p.accum_batch_stride + h * p.accum_head_stride +
                           (Accum::padded_first_row(rows.q_start, b, varlen) + m0) * kD;
  const int w = static_cast<int>(threadIdx.x) / 128, t = static_cast<int>(threadIdx.x) % 128;
  const float4* chunk = reinterpret_cast<const float4*>(tile_base + w * Accum::kChunkFloats);
  auto* dq = static_cast<Storage*>(p.dq) + b * p.dq_batch_stride +
             (rows.q_start + m0) * p.dq_row_stride + h * p.dq_head_stride;
  const std::int64_t valid_rows = rows.num_queries - m0;
  const int head_dim = p.fwd.head_dim;
  if (stores == DqStores::kVectors) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 x = chunk[j * 128 + t];
      const int word = Accum::row_of(w, t, 0) * kWords + Accum::col_of(w, t, j, 0) / 2;
      staged[word] = tile::Dtype<T>::pack(x.x * p.scale, x.y * p.scale);
      staged[word + 8 * kWords] = tile::Dtype<T>::pack(x.z * p.scale, x.w * p.scale);
    }
    __syncthreads();
    constexpr int kPieces = kD / 8;  // 16-byte pieces a row
#pragma unroll
    for (int piece = static_cast<int>(threadIdx.x); piece < Accum::kM * kPieces; piece += 256) {
      const int row = piece / kPieces, col = 8 * (piece % kPieces);
      if (row >= valid_rows || col >= head_dim) continue;
      *reinterpret_cast<uint4*>(dq + row * p.dq_row_stride + col) =
          *reinterpret_cast<const uint4*>(staged + row * kWords + col / 2);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 x = chunk[j * 128 + t];
    const float v[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = Accum::row_of(w, t, 2 * r);
      const int col = Accum::col_of(w, t, j, 0);
      if (row >= valid_rows || col >= head_dim) continue;
      Storage* at = dq + row * p.dq_row_stride + col;
      const float lo = v[2 * r] * p.scale, hi = v[2 * r + 1] * p.scale;
      if (stores == DqStores::kPairs) {
        *reinterpret_cast<std::uint32_t*>(at) = tile::Dtype<T>::pack(lo, hi);
      } else {
        at[0] = tile::Dtype<T>::from_float(lo);
        if (col + 1 < head_dim) at[1] = tile::Dtype<T>::from_float(hi);
      }
    }
  }
}
#endif  // __CUDACC__

}  // namespace fmha::cuda::sm90
