// The sm80 forward kernel (mma.sync / ldmatrix / cp.async; runs on sm80..sm90).
//
// One block computes block_m(D) query rows of one (batch, head): 4 warps, each owning
// row_blocks(D) blocks of 16 rows. It walks the key tiles that its mask policy leaves visible,
// then the extra-key tiles, keeping the output and the softmax statistics in registers (online
// softmax), and writes out and lse once. Rows and key tiles are ranges of the sequence, or, for a
// mask with kTokenTiles (neighborhood attention), boxes of the token grid whose rows are gathered
// by token (resolved at compile time: the range policies keep their code).
//
// Written against the dtype-generic operand layer (tile_operands.cuh): fp16/bf16 and fp32 (tf32
// tensor cores; the 3xTF32 split unless p.allow_tf32) share this one loop, in k-steps of 32 bytes.
//
// Pipeline (one buffer each for Q, K and V):
//   wait K(t); barrier; issue V(t);  S = Q K(t)^T;  scores, mask, softmax
//   wait V(t); barrier; issue K(t+1); O += P V(t)
// so V(t) lands while Q K(t)^T runs and K(t+1) while P V(t) runs.
#pragma once

#include <cstdint>

#include "cuda/common/block_coords.cuh"
#include "cuda/common/forward_params.h"
#include "cuda/common/forward_policies.cuh"
#include "cuda/common/neighborhood_mask.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/tile_operands.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm80/tile_sizes.h"

namespace fmha::cuda::sm80 {

// Copies a [kRows, kD] tile of T elements (rows `row_stride` apart) into shared memory
// (rows smem_row<T>(kD) apart), zero-filling rows >= valid_rows and columns >= cols so that no
// garbage (possibly NaN) meets a zero probability or a zero q column in a product.
template <typename T, int kRows, int kD, typename Elem = typename tile::Dtype<T>::Storage>
__device__ __forceinline__ void load_tile_async(Elem* smem, const Elem* gmem,
                                                std::int64_t row_stride, int valid_rows, int cols,
                                                bool vector_loads) {
  constexpr int kPitch = smem_row<T>(kD);
  constexpr int kChunk = tile::kChunk<T>;
  if (vector_loads) {
    constexpr int kChunks = kD / kChunk;  // 16-byte chunks per row
    static_assert((kRows * kChunks) % kThreads == 0, "tile chunks must split evenly over threads");
#pragma unroll
    for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
      const int index = it * kThreads + static_cast<int>(threadIdx.x);
      const int r = index / kChunks;
      const int c = index % kChunks;
      const bool inside = r < valid_rows && c * kChunk < cols;
      const Elem* src = inside ? gmem + r * row_stride + c * kChunk : gmem;
      tile::cp_async_16(tile::shared_address(smem + r * kPitch + c * kChunk), src, inside ? 16 : 0);
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

// load_tile_async for rows gathered by token: row r is token tokens[r * token_stride] of `gmem`
// (rows `row_stride` apart), zero-filled when that token is -1 (past the grid, a hole).
template <typename T, int kRows, int kD, typename Elem = typename tile::Dtype<T>::Storage>
__device__ __forceinline__ void load_rows_async(Elem* smem, const Elem* gmem,
                                                std::int64_t row_stride, const int* tokens,
                                                int token_stride, int cols, bool vector_loads) {
  constexpr int kPitch = smem_row<T>(kD);
  constexpr int kChunk = tile::kChunk<T>;
  if (vector_loads) {
    constexpr int kChunks = kD / kChunk;
    static_assert((kRows * kChunks) % kThreads == 0, "tile chunks must split evenly over threads");
#pragma unroll
    for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
      const int index = it * kThreads + static_cast<int>(threadIdx.x);
      const int r = index / kChunks;
      const int c = index % kChunks;
      const int token = tokens[r * token_stride];
      const bool inside = token >= 0 && c * kChunk < cols;
      const Elem* src = inside ? gmem + token * row_stride + c * kChunk : gmem;
      tile::cp_async_16(tile::shared_address(smem + r * kPitch + c * kChunk), src, inside ? 16 : 0);
    }
  } else {
    for (int index = static_cast<int>(threadIdx.x); index < kRows * kD; index += kThreads) {
      const int r = index / kD;
      const int c = index % kD;
      const int token = tokens[r * token_stride];
      smem[r * kPitch + c] = (token >= 0 && c < cols) ? gmem[token * row_stride + c] : 0;
    }
  }
}

// A K or V tile: `valid` contiguous rows, or (kGather, tokens given) rows gathered by token, the
// token of row r at tokens[4 * r] (TokenTileSmem::key).
template <typename T, bool kGather, int kRows, int kD,
          typename Elem = typename tile::Dtype<T>::Storage>
__device__ __forceinline__ void load_key_tile(Elem* smem, const Elem* gmem, std::int64_t row_stride,
                                              int valid, const int* tokens, int cols,
                                              bool vector_loads) {
  if constexpr (kGather) {
    if (tokens != nullptr) {
      load_rows_async<T, kRows, kD>(smem, gmem, row_stride, tokens, 4, cols, vector_loads);
      return;
    }
  }
  load_tile_async<T, kRows, kD>(smem, gmem, row_stride, valid, cols, vector_loads);
}

// Shared-memory bookkeeping of a kTokenTiles mask (neighborhood attention), after the K/V tiles:
// the block's boxes, the query rows' tokens and group-major windows, and per key-tile buffer (two,
// see the pipeline) the keys' group-major coordinates and tokens and whether the box is full.
template <int kM, int kN>
struct TokenTileSmem {
  neighborhood::BlockTiles tiles;
  int full[2];
  int query_token[kM];
  int2 query_window[kM][3];  // (lo, hi) per axis; lo > hi for rows past the grid
  int4 key[2][kN];           // (y'0, y'1, y'2, token); all -1 for keys past the grid
};

// Writes key box u's coordinates and tokens into buffer u % 2 (every thread of the block calls it;
// the caller's next barrier publishes them).
template <int kM, int kN>
__device__ __forceinline__ void stage_key_box(TokenTileSmem<kM, kN>* tt, const NeighborhoodGrid& g,
                                              int u) {
  int origin[3];
  neighborhood::seen_box_origin(tt->tiles, u, origin);
  for (int c = static_cast<int>(threadIdx.x); c < kN; c += kThreads) {
    int yp[3];
    const int token = neighborhood::box_token(g, tt->tiles.seen_shape, origin, c, yp);
    tt->key[u & 1][c] =
        token >= 0 ? make_int4(yp[0], yp[1], yp[2], token) : make_int4(-1, -1, -1, -1);
  }
  if (threadIdx.x == 0) tt->full[u & 1] = neighborhood::seen_box_is_full(g, tt->tiles, u, kN);
}

// A token-tile block's setup (the forward and the dQ kernel): its query box and key boxes, its
// rows' tokens and group-major windows, and key box 0. Every thread of the block calls it; returns
// the number of key boxes.
template <int kM, int kN>
__device__ __forceinline__ int stage_block_boxes(TokenTileSmem<kM, kN>* tt,
                                                 const NeighborhoodGrid& g, int m_block) {
  if (threadIdx.x == 0) tt->tiles = neighborhood::block_tiles(g, m_block, kM, kN);
  __syncthreads();
  for (int r = static_cast<int>(threadIdx.x); r < kM; r += kThreads) {
    neighborhood::AxisWindow w[3];
    tt->query_token[r] = neighborhood::own_box_entry(g, tt->tiles, r, /*transposed=*/false, w);
    for (int a = 0; a < 3; ++a) tt->query_window[r][a] = make_int2(w[a].lo, w[a].hi);
  }
  stage_key_box(tt, g, 0);
  __syncthreads();
  return tt->tiles.num_seen_tiles;
}

// Scores of one row block against a gathered key tile: bias / rel-pos by token, then (partial
// tiles) -inf where a key lies outside the row's window on some axis. This thread's entries 0, 1
// sit on local row `row`, 2, 3 on row + 8; entry 0 of n8 tile t is key col + 8t. One row at a
// time, so that only one window is live next to the accumulators.
template <typename Scores, int kM, int kN, int kTiles>
__device__ __forceinline__ void gathered_scores(const TokenTileSmem<kM, kN>* tt, int buffer,
                                                const Scores& scores, bool full,
                                                float (&s)[kTiles][4], int row, int col) {
  const bool additive = has_additive(scores);
  if (full && !additive) return;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row + 8 * half;
    const int query = tt->query_token[r];
    const int2 w0 = tt->query_window[r][0], w1 = tt->query_window[r][1];
    const int2 w2 = tt->query_window[r][2];
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int4 key = tt->key[buffer][col + t * 8 + c];
        float& x = s[t][2 * half + c];
        if (additive && query >= 0 && key.w >= 0) x += additive_log2(scores, query, key.w);
        if (!full && !(key.x >= w0.x && key.x <= w0.y && key.y >= w1.x && key.y <= w1.y &&
                       key.z >= w2.x && key.z <= w2.y)) {
          x = -INFINITY;
        }
      }
    }
  }
}

// The epilogue's stores for rows gathered by token: a warp writes its kWarpRows staged output rows
// (smem_o) to the rows of `out` named by `tokens` (-1: past the grid, not stored).
template <typename T, int kD, int kWarpRows, typename Elem = typename tile::Dtype<T>::Storage>
__device__ __forceinline__ void store_gathered_rows(const ForwardParams& p, std::int64_t b, int h,
                                                    const Elem* smem_o, const int* tokens,
                                                    int lane) {
  constexpr int kPitch = smem_row<T>(kD);
  constexpr int kChunk = tile::kChunk<T>;
  auto* out = static_cast<Elem*>(p.out) + b * p.out_batch_stride + h * p.out_head_stride;
  if (p.vector_stores) {
    constexpr int kChunks = kD / kChunk;
    for (int index = lane; index < kWarpRows * kChunks; index += 32) {
      const int r = index / kChunks;
      const int c = index % kChunks;
      const int token = tokens[r];
      if (token >= 0 && c * kChunk < p.value_dim) {
        *reinterpret_cast<uint4*>(out + token * p.out_row_stride + c * kChunk) =
            *reinterpret_cast<const uint4*>(smem_o + r * kPitch + c * kChunk);
      }
    }
  } else {
    for (int index = lane; index < kWarpRows * kD; index += 32) {
      const int r = index / kD;
      const int c = index % kD;
      const int token = tokens[r];
      if (token >= 0 && c < p.value_dim) out[token * p.out_row_stride + c] = smem_o[r * kPitch + c];
    }
  }
}

// Where the keys of tile u come from: the tiles of ordinary keys the mask leaves, then the
// tiles of extra keys.
template <typename Elem>
struct KeyTile {
  const Elem* k;
  const Elem* v;
  std::int64_t k_row_stride, v_row_stride;
  std::int64_t first_key;  // position of the tile's first key among its own key set
  int valid;               // keys of the tile that exist (the rest is zero-filled)
  bool extra;
};

// The kernel body; kSplit selects the 3xTF32 products for fp32 (tile_operands.cuh) and is false
// for 16-bit types.
template <typename T, int kD, typename Policy, bool kSplit>
__device__ __forceinline__ void forward_body(const ForwardParams& p) {
  constexpr int kM = block_m<T>(kD);
  constexpr int kN = block_n<T>(kD);
  constexpr int kRowBlocks = row_blocks<T>(kD);  // m16 row blocks per warp
  constexpr int kWarpRows = 16 * kRowBlocks;
  constexpr int kPitch = smem_row<T>(kD);
  constexpr int kScoreTiles = kN / 8;     // n8 accumulator tiles of a row block's 16 x kN scores
  constexpr int kOutTiles = kD / 8;       // n8 accumulator tiles of a row block's 16 x kD output
  constexpr int kStep = tile::kStepK<T>;  // k elements per product step (32 bytes)
  constexpr int kChunk = tile::kChunk<T>;
  using Mask = typename Policy::Mask;
  using Scores = typename Policy::template Scores<T>;
  using Convert = tile::Dtype<T>;
  using Elem = typename Convert::Storage;
  using Frag = tile::Frag<T, kSplit>;
  // Rows and keys gathered from grid boxes (neighborhood attention) instead of sequence ranges.
  constexpr bool kTokenTiles = Mask::kTokenTiles;

  extern __shared__ __align__(16) std::uint8_t smem_bytes_[];
  Elem* const smem_q = reinterpret_cast<Elem*>(smem_bytes_);
  Elem* const smem_k = smem_q + kM * kPitch;
  Elem* const smem_v = smem_k + kN * kPitch;
  auto* const tt = reinterpret_cast<TokenTileSmem<kM, kN>*>(smem_v + kN * kPitch);  // token tiles

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t b = blockIdx.z;
  const int h = static_cast<int>(blockIdx.y);
  // Last row blocks first: under a causal mask they have the most key tiles.
  const std::int64_t m_block = static_cast<std::int64_t>(gridDim.x) - 1 - blockIdx.x;

  const SequenceRows rows_of_batch = sequence_rows(p, b);
  const std::int64_t q_start = rows_of_batch.q_start, k_start = rows_of_batch.k_start;
  const std::int64_t num_queries = rows_of_batch.num_queries, num_keys = rows_of_batch.num_keys;
  // Token tiles: the block's rows are tokens of its grid box, so the pointers start at token 0.
  const std::int64_t m0 = kTokenTiles ? 0 : m_block * kM;
  if (m0 >= num_queries) return;  // varlen: this sequence is shorter than the longest
  const int rows = static_cast<int>(num_queries - m0 < kM ? num_queries - m0 : kM);
  const std::int64_t last_row = m0 + rows - 1;
  const int hk = h / p.kv_group;

  const auto* q = static_cast<const Elem*>(p.q) + b * p.q_batch_stride +
                  (q_start + m0) * p.q_row_stride + h * p.q_head_stride;
  const auto* k = static_cast<const Elem*>(p.k) + b * p.k_batch_stride + k_start * p.k_row_stride +
                  hk * p.k_head_stride;
  const auto* v = static_cast<const Elem*>(p.v) + b * p.v_batch_stride + k_start * p.v_row_stride +
                  hk * p.v_head_stride;
  const auto* extra_k =
      static_cast<const Elem*>(p.extra_k) + b * p.extra_k_batch_stride + hk * p.extra_k_head_stride;
  const auto* extra_v =
      static_cast<const Elem*>(p.extra_v) + b * p.extra_v_batch_stride + hk * p.extra_v_head_stride;

  const Mask mask = Mask::make(p, num_queries, num_keys);
  const Scores scores = Scores::make(p, b, h, num_queries, num_keys);
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
  const std::int64_t num_tiles = main_tiles + (p.num_extra + kN - 1) / kN;

  auto key_tile = [&](std::int64_t u) {
    KeyTile<Elem> t;
    t.extra = u >= main_tiles;
    if (!t.extra && kTokenTiles) {  // gathered by token from key box u (stage_key_box)
      t.first_key = 0;
      t.k_row_stride = p.k_row_stride;
      t.v_row_stride = p.v_row_stride;
      t.k = k;
      t.v = v;
      t.valid = kN;
    } else if (!t.extra) {
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

  // Token tiles read the K/V rows of ordinary key tiles by the tokens that stage_key_box wrote.
  auto key_tokens = [&](const KeyTile<Elem>& t, std::int64_t u) -> const int* {
    return kTokenTiles && !t.extra ? &tt->key[u & 1][0].w : nullptr;
  };

  if constexpr (kTokenTiles) {
    load_rows_async<T, kM, kD>(smem_q, q, p.q_row_stride, tt->query_token, 1, p.head_dim,
                               p.vector_loads);
  } else {
    load_tile_async<T, kM, kD>(smem_q, q, p.q_row_stride, rows, p.head_dim, p.vector_loads);
  }
  if (num_tiles > 0) {
    const KeyTile<Elem> t = key_tile(0);
    load_key_tile<T, kTokenTiles, kN, kD>(smem_k, t.k, t.k_row_stride, t.valid, key_tokens(t, 0),
                                          p.head_dim, p.vector_loads);
  }
  tile::cp_async_commit();

  // ldmatrix row addresses of this lane (see tile_primitives.cuh for the fragment layouts), in
  // 16-byte chunks (8 elements of a 16-bit type, 4 floats).
  // A (Q): lanes 0-15 rows 0-15 at chunk 0, lanes 16-31 the same rows at chunk 1.
  const std::uint32_t q_lane =
      tile::shared_address(smem_q + (warp * kWarpRows + lane % 16) * kPitch + (lane / 16) * kChunk);
  // B (K, row = key): matrices (keys 0-7, chunk 0), (0-7, 1), (8-15, 0), (8-15, 1).
  const std::uint32_t k_lane = tile::shared_address(smem_k + ((lane / 16) * 8 + lane % 8) * kPitch +
                                                    ((lane / 8) % 2) * kChunk);
  // B (V, row = key): column loads (tile_operands.cuh).
  const std::uint32_t v_lane =
      tile::shared_address(smem_v + tile::b_cols_lane_offset<T, kPitch>(lane));
  constexpr std::uint32_t kBytes = sizeof(Elem);

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
    const KeyTile<Elem> tile = key_tile(u);
    tile::cp_async_wait<0>();
    __syncthreads();  // K(u) visible to all; every warp is done with V(u - 1)
    load_key_tile<T, kTokenTiles, kN, kD>(smem_v, tile.v, tile.v_row_stride, tile.valid,
                                          key_tokens(tile, u), p.value_dim, p.vector_loads);
    tile::cp_async_commit();
    if constexpr (kTokenTiles) {
      // Key box u + 1 into the other buffer, last read by tile u - 1 before the barrier above.
      if (u + 1 < main_tiles) stage_key_box(tt, *mask.grid, static_cast<int>(u + 1));
    }

    float s[kRowBlocks][kScoreTiles][4];
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t)
        s[rb][t][0] = s[rb][t][1] = s[rb][t][2] = s[rb][t][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kD / kStep; ++kk) {
      if (kk * kStep >= p.head_dim) break;  // zero columns of the bucket
      Frag a[kRowBlocks];
#pragma unroll
      for (int rb = 0; rb < kRowBlocks; ++rb) {
        tile::load_rows(a[rb], q_lane + (rb * 16 * kPitch + kk * kStep) * kBytes);
      }
#pragma unroll
      for (int np = 0; np < kScoreTiles / 2; ++np) {
        Frag bk;
        tile::load_rows(bk, k_lane + (np * 16 * kPitch + kk * kStep) * kBytes);
#pragma unroll
        for (int rb = 0; rb < kRowBlocks; ++rb) {
          tile::mma_fresh<kD / kStep>(s[rb][2 * np], a[rb], bk, 0);
          tile::mma_fresh<kD / kStep>(s[rb][2 * np + 1], a[rb], bk, 1);
        }
      }
    }

    const std::int64_t first_col = tile.first_key + fragment_col;
    bool full;
    if constexpr (kTokenTiles) {
      full = tile.extra ? tile.valid == kN : tt->full[u & 1] != 0;
    } else {
      full = tile.extra ? tile.valid == kN : mask.tile_is_full(m0, last_row, tile.first_key, kN);
    }
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
      const std::int64_t row = fragment_row + rb * 16;
      scores.transform(s[rb]);
      if (!tile.extra) {
        if constexpr (kTokenTiles) {
          // m0 is 0: row is the block-local row.
          gathered_scores(tt, static_cast<int>(u & 1), scores, full, s[rb], static_cast<int>(row),
                          fragment_col);
        } else {
          scores.add_bias(s[rb], row, first_col);
          if (!full) hide_invisible(mask, s[rb], row, first_col);
        }
      } else if (!full) {
        // Extra keys: visible to every query, no bias or rel-pos (softcap applies, above).
        hide_invisible(MaskNone{p.num_extra}, s[rb], row, first_col);
      }
      softmax[rb].update(s[rb], o[rb]);
    }

    tile::cp_async_wait<0>();
    __syncthreads();  // V(u) visible to all; every warp is done with K(u)
    if (u + 1 < num_tiles) {
      const KeyTile<Elem> next = key_tile(u + 1);
      load_key_tile<T, kTokenTiles, kN, kD>(smem_k, next.k, next.k_row_stride, next.valid,
                                            key_tokens(next, u + 1), p.head_dim, p.vector_loads);
    }
    tile::cp_async_commit();

    // fp32 exact up to D 64: the tile's P V in an accumulator of its own (registers allow it
    // there), its products straight in (tile::mma_fresh), added to O once; otherwise into O.
    constexpr bool kTilePv = tile::kIsFloat<T> && kSplit && kD <= 64;
    float pv[kRowBlocks][kOutTiles][4];
    if constexpr (kTilePv) {
#pragma unroll
      for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
        for (int t = 0; t < kOutTiles; ++t)
          pv[rb][t][0] = pv[rb][t][1] = pv[rb][t][2] = pv[rb][t][3] = 0.0f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kN / kStep; ++kk) {
      // The score accumulators of the step's key columns are the A fragment of P.
      Frag a[kRowBlocks];
#pragma unroll
      for (int rb = 0; rb < kRowBlocks; ++rb) tile::from_accumulators(a[rb], s[rb], kk);
#pragma unroll
      for (int np = 0; np < kD / 16; ++np) {
        if (np * 16 >= p.value_dim) break;  // zero columns of the bucket
        Frag bv;
        tile::load_b_cols<T, kPitch>(bv, v_lane + (kk * kStep * kPitch + np * 16) * kBytes);
#pragma unroll
        for (int rb = 0; rb < kRowBlocks; ++rb) {
          if constexpr (kTilePv) {
            tile::mma_fresh<kN / kStep>(pv[rb][2 * np], a[rb], bv, 0);
            tile::mma_fresh<kN / kStep>(pv[rb][2 * np + 1], a[rb], bv, 1);
          } else {
            tile::mma(o[rb][2 * np], a[rb], bv, 0);
            tile::mma(o[rb][2 * np + 1], a[rb], bv, 1);
          }
        }
      }
    }
    if constexpr (kTilePv) {
#pragma unroll
      for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
        for (int t = 0; t < kOutTiles; ++t) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[rb][t][e] += pv[rb][t][e];
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
  Elem* const smem_o = smem_q + warp * kWarpRows * kPitch;
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
        tile::store_pair<T>(smem_o + row * kPitch + t * 8 + fragment_col,
                            o[rb][t][2 * r] * factor[r], o[rb][t][2 * r + 1] * factor[r]);
      }
    }
    if (p.lse != nullptr && lane % 4 == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const std::int64_t i = kTokenTiles ? tt->query_token[fragment_row + rb * 16 + 8 * r]
                                           : fragment_row + rb * 16 + 8 * r;
        if ((!kTokenTiles || i >= 0) && i < num_queries) {  // token -1: past the grid
          p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + (q_start + i) * p.lse_row_stride] =
              lse[r];
        }
      }
    }
  }
  __syncwarp();

  if constexpr (kTokenTiles) {
    store_gathered_rows<T, kD, kWarpRows>(p, b, h, smem_o, tt->query_token + warp * kWarpRows,
                                          lane);
    return;
  }
  const int warp_rows = rows - warp * kWarpRows;  // rows of this warp that exist (may be <= 0)
  auto* out = static_cast<Elem*>(p.out) + b * p.out_batch_stride +
              (q_start + m0 + warp * kWarpRows) * p.out_row_stride + h * p.out_head_stride;
  if (p.vector_stores) {
    constexpr int kChunks = kD / kChunk;
    for (int index = lane; index < kWarpRows * kChunks; index += 32) {
      const int r = index / kChunks;
      const int c = index % kChunks;
      if (r < warp_rows && c * kChunk < p.value_dim) {
        *reinterpret_cast<uint4*>(out + r * p.out_row_stride + c * kChunk) =
            *reinterpret_cast<const uint4*>(smem_o + r * kPitch + c * kChunk);
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

template <typename T, int kD, typename Policy>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const __grid_constant__ ForwardParams p) {
  if constexpr (tile::kIsFloat<T>) {
    // allow_tf32 is a runtime option: one uniform branch here, none in the loops.
    if (p.allow_tf32) {
      forward_body<T, kD, Policy, false>(p);
    } else {
      forward_body<T, kD, Policy, true>(p);
    }
  } else {
    forward_body<T, kD, Policy, false>(p);
  }
}

}  // namespace fmha::cuda::sm80
