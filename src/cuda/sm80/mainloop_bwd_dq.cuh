// The sm80 dQ kernel of the split backward (mma.sync / ldmatrix / cp.async; runs on sm80..sm90).
//
// The forward's loop with dS in place of P: one block owns kBlockM query rows of one (batch, head),
// 16 per warp, walks the key tiles its mask policy leaves visible and then the extra-key tiles,
// and per tile recomputes
//   S = Q K^T, P = exp2(S - lse), dP = dO V^T, dS = P (dP - Delta) * d(score)/d(scale q.k)
//   dQ += dS K                               (registers; no atomics, so deterministic)
// and writes dq = scale * dQ once. Single-buffered: K(t) and V(t) load together. Written against
// the dtype-generic operand layer (tile_operands.cuh), like the forward. With a kTokenTiles mask
// (neighborhood attention) the block's queries are a box of the token grid and its key tiles the
// boxes they see, every row gathered by token, as in the forward (where the bookkeeping fits,
// dq_token_tiles; else flattened rows with per-row windows).
#pragma once

#include <cstdint>

#include "cuda/common/backward_params.h"
#include "cuda/common/backward_policies.cuh"
#include "cuda/common/block_coords.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/tile_operands.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm80/mainloop_fwd.cuh"
#include "cuda/sm80/tile_sizes_bwd.h"

namespace fmha::cuda::sm80 {

// Token tiles for a mask that has them, where the forward's bookkeeping (TokenTileSmem) fits beside
// the dQ kernel's tiles in the 99 KB sm86/sm89 allow: every 16-bit bucket but 256, whose tiles take
// all of it; there (and for fp32 tiles that need more) the kernel walks flattened rows with
// per-row windows.
template <typename T, int kD, typename Mask>
constexpr bool dq_token_tiles() {
  return Mask::kTokenTiles &&
         bwd_dq_smem_bytes<T>(kD) +
                 static_cast<int>(sizeof(TokenTileSmem<kBlockM, dq_block_n<T>(kD)>)) <=
             99 * 1024;
}
template <typename T, int kD, typename Mask>
constexpr int dq_smem_bytes() {
  return bwd_dq_smem_bytes<T>(kD) +
         (dq_token_tiles<T, kD, Mask>()
              ? static_cast<int>(sizeof(TokenTileSmem<kBlockM, dq_block_n<T>(kD)>))
              : 0);
}

// The kernel body; kSplit selects the 3xTF32 products for fp32 (tile_operands.cuh) and is false
// for 16-bit types.
template <typename T, int kD, typename Policy, bool kSplit>
__device__ __forceinline__ void backward_dq_body(const BackwardParams& p) {
  constexpr int kN = dq_block_n<T>(kD);
  constexpr int kPitch = smem_row<T>(kD);
  constexpr int kScoreTiles = kN / 8;
  constexpr int kOutTiles = kD / 8;
  constexpr int kStep = tile::kStepK<T>;  // k elements per product step (32 bytes)
  constexpr int kChunk = tile::kChunk<T>;
  using Mask = typename Policy::Mask;
  using KeyTest = decltype(visible_keys(Mask{}, std::int64_t{}, std::int64_t{}, 0));
  using Scores = typename Policy::template Scores<T>;
  using Convert = tile::Dtype<T>;
  using Elem = typename Convert::Storage;
  using Frag = tile::Frag<T, kSplit>;
  const ForwardParams& f = p.fwd;
  // Queries and keys gathered from grid boxes (neighborhood attention) instead of sequence ranges.
  constexpr bool kTokenTiles = dq_token_tiles<T, kD, Mask>();
  using TokenTiles = TokenTileSmem<kBlockM, kN>;

  extern __shared__ __align__(16) std::uint8_t smem_bytes_[];
  Elem* const smem_q = reinterpret_cast<Elem*>(smem_bytes_);
  Elem* const smem_do = smem_q + kBlockM * kPitch;
  Elem* const smem_k = smem_do + kBlockM * kPitch;
  Elem* const smem_v = smem_k + kN * kPitch;
  auto* const tt = reinterpret_cast<TokenTiles*>(smem_v + kN * kPitch);  // token tiles

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t b = blockIdx.z;
  const int h = static_cast<int>(blockIdx.y);
  const std::int64_t m_block = static_cast<std::int64_t>(gridDim.x) - 1 - blockIdx.x;

  const SequenceRows rows_of_batch = sequence_rows(f, b);
  const std::int64_t q_start = rows_of_batch.q_start, k_start = rows_of_batch.k_start;
  const std::int64_t num_queries = rows_of_batch.num_queries, num_keys = rows_of_batch.num_keys;
  // Token tiles: the block's rows are tokens of its grid box, so the pointers start at token 0.
  const std::int64_t m0 = kTokenTiles ? 0 : m_block * kBlockM;
  if (m0 >= num_queries) return;
  const int rows = kTokenTiles
                       ? kBlockM
                       : static_cast<int>(num_queries - m0 < kBlockM ? num_queries - m0 : kBlockM);
  const std::int64_t last_row = m0 + rows - 1;
  const int hk = h / f.kv_group;

  const auto* q = static_cast<const Elem*>(f.q) + b * f.q_batch_stride +
                  (q_start + m0) * f.q_row_stride + h * f.q_head_stride;
  const auto* dout = static_cast<const Elem*>(p.dout) + b * p.dout_batch_stride +
                     (q_start + m0) * p.dout_row_stride + h * p.dout_head_stride;
  const auto* k = static_cast<const Elem*>(f.k) + b * f.k_batch_stride + k_start * f.k_row_stride +
                  hk * f.k_head_stride;
  const auto* v = static_cast<const Elem*>(f.v) + b * f.v_batch_stride + k_start * f.v_row_stride +
                  hk * f.v_head_stride;
  const auto* extra_k =
      static_cast<const Elem*>(f.extra_k) + b * f.extra_k_batch_stride + hk * f.extra_k_head_stride;
  const auto* extra_v =
      static_cast<const Elem*>(f.extra_v) + b * f.extra_v_batch_stride + hk * f.extra_v_head_stride;

  const Mask mask = Mask::make(f, num_queries, num_keys);
  const Scores scores = Scores::make(f, b, h, num_queries, num_keys);
  std::int64_t first_tile = 0, main_tiles = 0;
  if constexpr (kTokenTiles) {
    main_tiles = stage_block_boxes(tt, *mask.grid, static_cast<int>(m_block));
  } else {
    const KeyRange range = mask.key_range(m0, last_row);
    if (range.end > range.begin) {
      first_tile = range.begin / kN;
      main_tiles = (range.end + kN - 1) / kN - first_tile;
    }
  }
  const std::int64_t num_tiles = main_tiles + (f.num_extra + kN - 1) / kN;

  auto key_tile = [&](std::int64_t u) {
    KeyTile<Elem> t;
    t.extra = u >= main_tiles;
    if (!t.extra && kTokenTiles) {  // gathered by token from key box u (stage_key_box)
      t.first_key = 0;
      t.k = k;
      t.v = v;
      t.valid = kN;
    } else if (!t.extra) {
      t.first_key = (first_tile + u) * kN;
      t.k = k + t.first_key * f.k_row_stride;
      t.v = v + t.first_key * f.v_row_stride;
      t.valid = static_cast<int>(num_keys - t.first_key < kN ? num_keys - t.first_key : kN);
    } else {
      t.first_key = (u - main_tiles) * kN;
      t.k = extra_k + t.first_key * f.extra_k_row_stride;
      t.v = extra_v + t.first_key * f.extra_v_row_stride;
      t.valid = static_cast<int>(f.num_extra - t.first_key < kN ? f.num_extra - t.first_key : kN);
    }
    return t;
  };
  auto load_keys = [&](std::int64_t u) {
    const KeyTile<Elem> t = key_tile(u);
    // Token tiles read the K/V rows of ordinary key tiles by the tokens stage_key_box wrote.
    const int* tokens = kTokenTiles && !t.extra ? &tt->key[u & 1][0].w : nullptr;
    load_key_tile<T, kTokenTiles, kN, kD>(smem_k, t.k,
                                          t.extra ? f.extra_k_row_stride : f.k_row_stride, t.valid,
                                          tokens, f.head_dim, f.vector_loads);
    load_key_tile<T, kTokenTiles, kN, kD>(smem_v, t.v,
                                          t.extra ? f.extra_v_row_stride : f.v_row_stride, t.valid,
                                          tokens, f.value_dim, f.vector_loads);
  };

  if constexpr (kTokenTiles) {
    load_rows_async<T, kBlockM, kD>(smem_q, q, f.q_row_stride, tt->query_token, 1, f.head_dim,
                                    f.vector_loads);
    load_rows_async<T, kBlockM, kD>(smem_do, dout, p.dout_row_stride, tt->query_token, 1,
                                    f.value_dim, f.vector_loads);
  } else {
    load_tile_async<T, kBlockM, kD>(smem_q, q, f.q_row_stride, rows, f.head_dim, f.vector_loads);
    load_tile_async<T, kBlockM, kD>(smem_do, dout, p.dout_row_stride, rows, f.value_dim,
                                    f.vector_loads);
  }
  if (num_tiles > 0) load_keys(0);
  tile::cp_async_commit();

  constexpr std::uint32_t kBytes = sizeof(Elem);
  // A (Q, dO: this warp's 16 rows): lanes 0-15 rows 0-15 at chunk 0, 16-31 at chunk 1.
  const int a_row = warp * 16 + lane % 16, a_col = (lane / 16) * kChunk;
  const std::uint32_t q_a = tile::shared_address(smem_q + a_row * kPitch + a_col);
  const std::uint32_t do_a = tile::shared_address(smem_do + a_row * kPitch + a_col);
  // B with n = key (K, V as stored) and B with k = key (K through column loads), as in the
  // forward.
  const int bn_row = (lane / 16) * 8 + lane % 8, bn_col = ((lane / 8) % 2) * kChunk;
  const std::uint32_t k_bn = tile::shared_address(smem_k + bn_row * kPitch + bn_col);
  const std::uint32_t v_bn = tile::shared_address(smem_v + bn_row * kPitch + bn_col);
  const std::uint32_t k_bk =
      tile::shared_address(smem_k + tile::b_cols_lane_offset<T, kPitch>(lane));

  const std::int64_t fragment_row = m0 + warp * 16 + lane / 4;  // +8 for entries 2, 3
  const int fragment_col = 2 * (lane % 4);
  // Per-row statistics of the two rows this thread owns (rows past the end: P = 0).
  // Token tiles: the row's token (m0 is 0, so fragment_row is the block-local row); -1 past the
  // grid.
  float lse_log2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t i =
        kTokenTiles ? tt->query_token[fragment_row + 8 * r] : fragment_row + 8 * r;
    const bool exists = kTokenTiles ? i >= 0 : i < num_queries;
    const std::int64_t stat = b * p.stat_batch_stride + h * p.stat_head_stride + q_start + i;
    lse_log2[r] = exists ? p.lse_log2[stat] : INFINITY;
    delta[r] = exists ? p.delta[stat] : 0.0f;
  }

  float dq[kOutTiles][4];
#pragma unroll
  for (int t = 0; t < kOutTiles; ++t) dq[t][0] = dq[t][1] = dq[t][2] = dq[t][3] = 0.0f;

  for (std::int64_t u = 0; u < num_tiles; ++u) {
    const KeyTile<Elem> tile = key_tile(u);
    tile::cp_async_wait<0>();
    __syncthreads();  // K(u), V(u) (and Q, dO) visible to all
    if constexpr (kTokenTiles) {
      // Key box u + 1 into the other buffer, last read by tile u - 1 before the barrier above; the
      // barrier after the products publishes it to tile u + 1's loads.
      if (u + 1 < main_tiles) stage_key_box(tt, *mask.grid, static_cast<int>(u + 1));
    }

    float s[kScoreTiles][4], dp[kScoreTiles][4];
#pragma unroll
    for (int t = 0; t < kScoreTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] = dp[t][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kD / kStep; ++kk) {
      if (kk * kStep >= f.head_dim) break;
      Frag a;
      tile::load_rows(a, q_a + kk * kStep * kBytes);
#pragma unroll
      for (int np = 0; np < kScoreTiles / 2; ++np) {
        Frag bk;
        tile::load_rows(bk, k_bn + (np * 16 * kPitch + kk * kStep) * kBytes);
        tile::mma_fresh<kD / kStep>(s[2 * np], a, bk, 0);
        tile::mma_fresh<kD / kStep>(s[2 * np + 1], a, bk, 1);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kD / kStep; ++kk) {
      if (kk * kStep >= f.value_dim) break;
      Frag a;
      tile::load_rows(a, do_a + kk * kStep * kBytes);
#pragma unroll
      for (int np = 0; np < kScoreTiles / 2; ++np) {
        Frag bv;
        tile::load_rows(bv, v_bn + (np * 16 * kPitch + kk * kStep) * kBytes);
        tile::mma_fresh<kD / kStep>(dp[2 * np], a, bv, 0);
        tile::mma_fresh<kD / kStep>(dp[2 * np + 1], a, bv, 1);
      }
    }

    const bool additive = !tile.extra && has_additive(scores);
    if (kTokenTiles && !tile.extra) {
      // The forward's test (gathered_scores): a key is seen iff its group-major coordinates lie in
      // the row's window on every axis, or the box is full. Rows past the grid have lse +inf (P =
      // 0) and empty windows; keys past it coordinates -1, outside every window. One row at a time,
      // so that only one window is live next to the accumulators.
      const int buffer = static_cast<int>(u & 1);
      const bool full = tt->full[buffer] != 0;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int local = static_cast<int>(fragment_row) + 8 * r;
        const int query = tt->query_token[local];
        const int2 w0 = tt->query_window[local][0], w1 = tt->query_window[local][1];
        const int2 w2 = tt->query_window[local][2];
#pragma unroll
        for (int t = 0; t < kScoreTiles; ++t) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int e = 2 * r + c;
            const int4 key = tt->key[buffer][t * 8 + fragment_col + c];
            float grad;
            float x = score_with_grad(scores, s[t][e], &grad);
            if (additive && query >= 0 && key.w >= 0) x += additive_log2(scores, query, key.w);
            const bool seen = full || (key.x >= w0.x && key.x <= w0.y && key.y >= w1.x &&
                                       key.y <= w1.y && key.z >= w2.x && key.z <= w2.y);
            const float prob = seen ? exp2f(x - lse_log2[r]) : 0.0f;
            dp[t][e] = prob * (dp[t][e] - delta[r]) * grad;
          }
        }
      }
    } else {
      // Keys of the tile that each of this thread's two rows sees.
      KeyTest seen[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        seen[r] = tile.extra ? KeyTest::prefix(tile.valid)
                             : visible_keys(mask, fragment_row + 8 * r, tile.first_key, kN);
      }
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >= 2 ? 1 : 0;
          const int c = t * 8 + fragment_col + (e & 1);  // key within the tile
          float grad;
          float x = score_with_grad(scores, s[t][e], &grad);
          if (additive) x += additive_log2(scores, fragment_row + 8 * r, tile.first_key + c);
          const float prob = seen[r].contains(c) ? exp2f(x - lse_log2[r]) : 0.0f;
          dp[t][e] = prob * (dp[t][e] - delta[r]) * grad;
        }
      }
    }

#pragma unroll
    for (int kk = 0; kk < kN / kStep; ++kk) {
      Frag a;
      tile::from_accumulators(a, dp, kk);
#pragma unroll
      for (int np = 0; np < kD / 16; ++np) {
        if (np * 16 >= f.head_dim) break;
        Frag bk;
        tile::load_b_cols<T, kPitch>(bk, k_bk + (kk * kStep * kPitch + np * 16) * kBytes);
        tile::mma(dq[2 * np], a, bk, 0);
        tile::mma(dq[2 * np + 1], a, bk, 1);
      }
    }

    __syncthreads();  // every warp is done with K(u), V(u)
    if (u + 1 < num_tiles) load_keys(u + 1);
    tile::cp_async_commit();
  }
  tile::cp_async_wait<0>();  // Q/dO are still in flight when the block had no key tile

  auto* out = static_cast<Elem*>(p.dq) + b * p.dq_batch_stride + (q_start + m0) * p.dq_row_stride +
              h * p.dq_head_stride;
#pragma unroll
  for (int t = 0; t < kOutTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int local = warp * 16 + lane / 4 + (e >= 2 ? 8 : 0);
      const int col = t * 8 + fragment_col + (e & 1);
      // Token tiles: the row's token (out starts at token 0; -1: past the grid, not stored).
      const std::int64_t r = kTokenTiles ? tt->query_token[local] : local;
      if ((kTokenTiles ? r >= 0 : r < rows) && col < f.head_dim) {
        out[r * p.dq_row_stride + col] = Convert::from_float(dq[t][e] * p.scale);
      }
    }
  }
}

template <typename T, int kD, typename Policy>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(const __grid_constant__ BackwardParams p) {
  if constexpr (tile::kIsFloat<T>) {
    // allow_tf32 is a runtime option: one uniform branch here, none in the loops.
    if (p.fwd.allow_tf32) {
      backward_dq_body<T, kD, Policy, false>(p);
    } else {
      backward_dq_body<T, kD, Policy, true>(p);
    }
  } else {
    backward_dq_body<T, kD, Policy, false>(p);
  }
}

}  // namespace fmha::cuda::sm80
