// The sm80 forward kernel (mma.sync / ldmatrix / cp.async; runs on sm80..sm90).
//
// One block computes block_m(D) query rows of one (batch, head): 4 warps, each owning
// row_blocks(D) blocks of 16 rows. It walks the key tiles that its mask policy leaves visible,
// then the extra-key tiles, keeping the output and the softmax statistics in registers (online
// softmax), and writes out and lse once.
//
// Pipeline (one buffer each for Q, K and V):
//   wait K(t); barrier; issue V(t);  S = Q K(t)^T;  scores, mask, softmax
//   wait V(t); barrier; issue K(t+1); O += P V(t)
// so V(t) lands while Q K(t)^T runs and K(t+1) while P V(t) runs.
#pragma once

#include <cstdint>

#include "cuda/common/forward_params.h"
#include "cuda/common/forward_policies.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm80/tile_sizes.h"

namespace fmha::cuda::sm80 {

// Copies a [kRows, kD] tile of 16-bit elements (rows `row_stride` apart) into shared memory
// (rows smem_row(kD) apart), zero-filling rows >= valid_rows and columns >= cols so that no
// garbage (possibly NaN) meets a zero probability or a zero q column in a product.
template <int kRows, int kD>
__device__ __forceinline__ void load_tile_async(std::uint16_t* smem, const std::uint16_t* gmem,
                                                std::int64_t row_stride, int valid_rows, int cols,
                                                bool vector_loads) {
  constexpr int kPitch = smem_row(kD);
  if (vector_loads) {
    constexpr int kChunks = kD / 8;  // 16-byte chunks per row
    static_assert((kRows * kChunks) % kThreads == 0, "tile chunks must split evenly over threads");
#pragma unroll
    for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
      const int index = it * kThreads + static_cast<int>(threadIdx.x);
      const int r = index / kChunks;
      const int c = index % kChunks;
      const bool inside = r < valid_rows && c * 8 < cols;
      const std::uint16_t* src = inside ? gmem + r * row_stride + c * 8 : gmem;
      tile::cp_async_16(tile::shared_address(smem + r * kPitch + c * 8), src, inside ? 16 : 0);
    }
  } else {
    // Unaligned rows or head dims: plain element loads (ordered by the pipeline's barriers).
    for (int index = static_cast<int>(threadIdx.x); index < kRows * kD; index += kThreads) {
      const int r = index / kD;
      const int c = index % kD;
      smem[r * kPitch + c] = (r < valid_rows && c < cols) ? gmem[r * row_stride + c] : 0;
    }
  }
}

// Where the keys of tile u come from: the tiles of ordinary keys the mask leaves, then the
// tiles of extra keys.
struct KeyTile {
  const std::uint16_t* k;
  const std::uint16_t* v;
  std::int64_t k_row_stride, v_row_stride;
  std::int64_t first_key;  // position of the tile's first key among its own key set
  int valid;               // keys of the tile that exist (the rest is zero-filled)
  bool extra;
};

template <typename T, int kD, typename Policy>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const __grid_constant__ ForwardParams p) {
  constexpr int kM = block_m(kD);
  constexpr int kN = block_n(kD);
  constexpr int kRowBlocks = row_blocks(kD);  // m16 row blocks per warp
  constexpr int kWarpRows = 16 * kRowBlocks;
  constexpr int kPitch = smem_row(kD);
  constexpr int kScoreTiles = kN / 8;  // n8 accumulator tiles of a row block's 16 x kN scores
  constexpr int kOutTiles = kD / 8;    // n8 accumulator tiles of a row block's 16 x kD output
  using Mask = typename Policy::Mask;
  using Scores = typename Policy::template Scores<T>;
  using Convert = tile::Dtype<T>;

  extern __shared__ __align__(16) std::uint16_t smem[];
  std::uint16_t* const smem_q = smem;
  std::uint16_t* const smem_k = smem_q + kM * kPitch;
  std::uint16_t* const smem_v = smem_k + kN * kPitch;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t b = blockIdx.z;
  const int h = static_cast<int>(blockIdx.y);
  // Last row blocks first: under a causal mask they have the most key tiles.
  const std::int64_t m_block = static_cast<std::int64_t>(gridDim.x) - 1 - blockIdx.x;

  std::int64_t q_start = 0, k_start = 0, num_queries = p.seqlen_q, num_keys = p.seqlen_k;
  if (p.cu_seqlens_q != nullptr) {
    q_start = p.cu_seqlens_q[b];
    num_queries = p.cu_seqlens_q[b + 1] - q_start;
    k_start = p.cu_seqlens_k[b];
    num_keys = p.cu_seqlens_k[b + 1] - k_start;
  }
  const std::int64_t m0 = m_block * kM;
  if (m0 >= num_queries) return;  // varlen: this sequence is shorter than the longest
  const int rows = static_cast<int>(num_queries - m0 < kM ? num_queries - m0 : kM);
  const std::int64_t last_row = m0 + rows - 1;
  const int hk = h / p.kv_group;

  const auto* q = static_cast<const std::uint16_t*>(p.q) + b * p.q_batch_stride +
                  (q_start + m0) * p.q_row_stride + h * p.q_head_stride;
  const auto* k = static_cast<const std::uint16_t*>(p.k) + b * p.k_batch_stride +
                  k_start * p.k_row_stride + hk * p.k_head_stride;
  const auto* v = static_cast<const std::uint16_t*>(p.v) + b * p.v_batch_stride +
                  k_start * p.v_row_stride + hk * p.v_head_stride;
  const auto* extra_k = static_cast<const std::uint16_t*>(p.extra_k) + b * p.extra_k_batch_stride +
                        hk * p.extra_k_head_stride;
  const auto* extra_v = static_cast<const std::uint16_t*>(p.extra_v) + b * p.extra_v_batch_stride +
                        hk * p.extra_v_head_stride;

  const Mask mask = Mask::make(p, num_queries, num_keys);
  const Scores scores = Scores::make(p, b, h, num_queries, num_keys);
  const KeyRange range = mask.key_range(m0, last_row);
  std::int64_t first_tile = 0, main_tiles = 0;
  if (range.end > range.begin) {
    first_tile = range.begin / kN;
    main_tiles = (range.end + kN - 1) / kN - first_tile;
  }
  const std::int64_t num_tiles = main_tiles + (p.num_extra + kN - 1) / kN;

  auto key_tile = [&](std::int64_t u) {
    KeyTile t;
    t.extra = u >= main_tiles;
    if (!t.extra) {
      t.first_key = (first_tile + u) * kN;
      t.k_row_stride = p.k_row_stride;
      t.v_row_stride = p.v_row_stride;
      t.k = k + t.first_key * p.k_row_stride;
      t.v = v + t.first_key * p.v_row_stride;
      t.valid = static_cast<int>(num_keys - t.first_key < kN ? num_keys - t.first_key : kN);
    } else {
      t.first_key = (u - main_tiles) * kN;
      t.k_row_stride = p.extra_k_row_stride;
      t.v_row_stride = p.extra_v_row_stride;
      t.k = extra_k + t.first_key * p.extra_k_row_stride;
      t.v = extra_v + t.first_key * p.extra_v_row_stride;
      t.valid = static_cast<int>(p.num_extra - t.first_key < kN ? p.num_extra - t.first_key : kN);
    }
    return t;
  };

  load_tile_async<kM, kD>(smem_q, q, p.q_row_stride, rows, p.head_dim, p.vector_loads);
  if (num_tiles > 0) {
    const KeyTile t = key_tile(0);
    load_tile_async<kN, kD>(smem_k, t.k, t.k_row_stride, t.valid, p.head_dim, p.vector_loads);
  }
  tile::cp_async_commit();

  // ldmatrix row addresses of this lane (see tile_primitives.cuh for the fragment layouts).
  // A (Q): lanes 0-15 rows 0-15 at column 0, lanes 16-31 the same rows at column 8.
  const std::uint32_t q_lane =
      tile::shared_address(smem_q + (warp * kWarpRows + lane % 16) * kPitch + (lane / 16) * 8);
  // B (K, row = key): matrices (keys 0-7, d 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15).
  const std::uint32_t k_lane =
      tile::shared_address(smem_k + ((lane / 16) * 8 + lane % 8) * kPitch + ((lane / 8) % 2) * 8);
  // B (V, row = key, transposed): matrices (keys 0-7, dv 0-7), (8-15, 0-7), (0-7, 8-15), ...
  const std::uint32_t v_lane =
      tile::shared_address(smem_v + (((lane / 8) % 2) * 8 + lane % 8) * kPitch + (lane / 16) * 8);
  constexpr std::uint32_t kBytes = 2;  // per element

  // Row of accumulator entries 0, 1 in row block 0 (+8 for entries 2, 3; +16 per row block).
  const std::int64_t fragment_row = m0 + warp * kWarpRows + lane / 4;
  const int fragment_col = 2 * (lane % 4);  // +1 for entries 1, 3

  float o[kRowBlocks][kOutTiles][4];
  OnlineSoftmax softmax[kRowBlocks];
#pragma unroll
  for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
    for (int t = 0; t < kOutTiles; ++t)
      o[rb][t][0] = o[rb][t][1] = o[rb][t][2] = o[rb][t][3] = 0.0f;
    softmax[rb].init();
  }

  for (std::int64_t u = 0; u < num_tiles; ++u) {
    const KeyTile tile = key_tile(u);
    tile::cp_async_wait<0>();
    __syncthreads();  // K(u) visible to all; every warp is done with V(u - 1)
    load_tile_async<kN, kD>(smem_v, tile.v, tile.v_row_stride, tile.valid, p.value_dim,
                            p.vector_loads);
    tile::cp_async_commit();

    float s[kRowBlocks][kScoreTiles][4];
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t)
        s[rb][t][0] = s[rb][t][1] = s[rb][t][2] = s[rb][t][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      if (kk * 16 >= p.head_dim) break;  // zero columns of the bucket
      std::uint32_t a[kRowBlocks][4];
#pragma unroll
      for (int rb = 0; rb < kRowBlocks; ++rb) {
        tile::ldmatrix_x4(a[rb], q_lane + (rb * 16 * kPitch + kk * 16) * kBytes);
      }
#pragma unroll
      for (int np = 0; np < kScoreTiles / 2; ++np) {
        std::uint32_t bk[4];
        tile::ldmatrix_x4(bk, k_lane + (np * 16 * kPitch + kk * 16) * kBytes);
#pragma unroll
        for (int rb = 0; rb < kRowBlocks; ++rb) {
          tile::mma_m16n8k16<T>(s[rb][2 * np], a[rb], bk[0], bk[1]);
          tile::mma_m16n8k16<T>(s[rb][2 * np + 1], a[rb], bk[2], bk[3]);
        }
      }
    }

    const std::int64_t first_col = tile.first_key + fragment_col;
    const bool full =
        tile.extra ? tile.valid == kN : mask.tile_is_full(m0, last_row, tile.first_key, kN);
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
      const std::int64_t row = fragment_row + rb * 16;
      scores.transform(s[rb]);
      if (!tile.extra) {
        scores.add_bias(s[rb], row, first_col);
        if (!full) hide_invisible(mask, s[rb], row, first_col);
      } else if (!full) {
        // Extra keys: visible to every query, no bias or rel-pos (softcap applies, above).
        hide_invisible(MaskNone{p.num_extra}, s[rb], row, first_col);
      }
      softmax[rb].update(s[rb], o[rb]);
    }

    tile::cp_async_wait<0>();
    __syncthreads();  // V(u) visible to all; every warp is done with K(u)
    if (u + 1 < num_tiles) {
      const KeyTile next = key_tile(u + 1);
      load_tile_async<kN, kD>(smem_k, next.k, next.k_row_stride, next.valid, p.head_dim,
                              p.vector_loads);
    }
    tile::cp_async_commit();

#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      // The score accumulators of key columns 16kk..16kk+15 are exactly the A fragment of P.
      std::uint32_t a[kRowBlocks][4];
#pragma unroll
      for (int rb = 0; rb < kRowBlocks; ++rb) {
        a[rb][0] = Convert::pack(s[rb][2 * kk][0], s[rb][2 * kk][1]);
        a[rb][1] = Convert::pack(s[rb][2 * kk][2], s[rb][2 * kk][3]);
        a[rb][2] = Convert::pack(s[rb][2 * kk + 1][0], s[rb][2 * kk + 1][1]);
        a[rb][3] = Convert::pack(s[rb][2 * kk + 1][2], s[rb][2 * kk + 1][3]);
      }
#pragma unroll
      for (int np = 0; np < kD / 16; ++np) {
        if (np * 16 >= p.value_dim) break;  // zero columns of the bucket
        std::uint32_t bv[4];
        tile::ldmatrix_x4_trans(bv, v_lane + (kk * 16 * kPitch + np * 16) * kBytes);
#pragma unroll
        for (int rb = 0; rb < kRowBlocks; ++rb) {
          tile::mma_m16n8k16<T>(o[rb][2 * np], a[rb], bv[0], bv[1]);
          tile::mma_m16n8k16<T>(o[rb][2 * np + 1], a[rb], bv[2], bv[3]);
        }
      }
    }
  }

  // Epilogue. Q's copy must have landed before its rows are reused for the output (it is still
  // in flight when the block had no key tile at all).
  tile::cp_async_wait<0>();
  __syncthreads();
  const float sink_log2 = p.sinks != nullptr ? p.sinks[h * p.sinks_stride] * kLog2e : -INFINITY;
  // Each warp stages its own rows in its own rows of Q's buffer: only a warp barrier needed.
  std::uint16_t* const smem_o = smem_q + warp * kWarpRows * kPitch;
#pragma unroll
  for (int rb = 0; rb < kRowBlocks; ++rb) {
    float factor[2], lse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) factor[r] = softmax[rb].finish_row(r, sink_log2, &lse[r]);
#pragma unroll
    for (int t = 0; t < kOutTiles; ++t) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = rb * 16 + lane / 4 + 8 * r;
        *reinterpret_cast<std::uint32_t*>(smem_o + row * kPitch + t * 8 + fragment_col) =
            Convert::pack(o[rb][t][2 * r] * factor[r], o[rb][t][2 * r + 1] * factor[r]);
      }
    }
    if (p.lse != nullptr && lane % 4 == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const std::int64_t i = fragment_row + rb * 16 + 8 * r;
        if (i < num_queries) {
          p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + (q_start + i) * p.lse_row_stride] =
              lse[r];
        }
      }
    }
  }
  __syncwarp();

  const int warp_rows = rows - warp * kWarpRows;  // rows of this warp that exist (may be <= 0)
  auto* out = static_cast<std::uint16_t*>(p.out) + b * p.out_batch_stride +
              (q_start + m0 + warp * kWarpRows) * p.out_row_stride + h * p.out_head_stride;
  if (p.vector_stores) {
    constexpr int kChunks = kD / 8;
    for (int index = lane; index < kWarpRows * kChunks; index += 32) {
      const int r = index / kChunks;
      const int c = index % kChunks;
      if (r < warp_rows && c * 8 < p.value_dim) {
        *reinterpret_cast<uint4*>(out + r * p.out_row_stride + c * 8) =
            *reinterpret_cast<const uint4*>(smem_o + r * kPitch + c * 8);
      }
    }
  } else {
    for (int index = lane; index < kWarpRows * kD; index += 32) {
      const int r = index / kD;
      const int c = index % kD;
      if (r < warp_rows && c < p.value_dim) out[r * p.out_row_stride + c] = smem_o[r * kPitch + c];
    }
  }
}

}  // namespace fmha::cuda::sm80
