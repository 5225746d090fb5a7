// The sm80 dK/dV kernel of the backward (mma.sync / ldmatrix / cp.async; runs on sm80..sm90).
//
// One block owns kBwdBlockN keys (or extra keys) of one (batch, kv head) and one column chunk of
// the head dims. It walks every query head of the kv head's GQA group and, per head, the query
// tiles that its mask policy lets see those keys, recomputing per tile (warp w owns keys
// 16w..16w+15, the A operand of every product):
//   S^T = K Q^T, P^T = exp2(S^T - lse)       (scores through the forward's policy, log2 units)
//   dP^T = V dO^T, dS^T = P^T (dP^T - Delta) * d(score)/d(scale q.k)
//   (dS before the last factor, the gradient wrt the final score, also goes to dbias / drel)
//   dV += P^T dO,  dK += dS^T Q              (registers; the group's sum stays inside the block)
// Written against the dtype-generic operand layer (tile_operands.cuh): fp16/bf16 and fp32 share
// this loop, in k-steps of 32 bytes (fp32: 3xTF32 unless p.fwd.allow_tf32).
// Fused mode (dq_accum given) also stages dS^T in shared memory and adds dQ += dS K to the fp32
// workspace with atomics; split mode leaves dQ to the dQ kernel.
// With a kTokenTiles mask (neighborhood attention) a block's keys are a box of the token grid and
// its query tiles the boxes of the queries that see them (block_tiles transposed), every row
// gathered by token (extra keys and their queries as consecutive tokens). Resolved at compile
// time: range masks keep their code.
//
// Pipeline: K and V load once. Per tile: wait Q/dO/lse(u); barrier; products; barrier (every
// warp is done with Q/dO(u), dS^T is visible); issue Q/dO(u+1); dQ products and atomics, which
// overlap the next tile's loads.
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

// Shared-memory bookkeeping of a kTokenTiles mask in the dK/dV kernel, after the per-row
// statistics: the block's boxes (block_tiles transposed: its keys, and the query boxes that see
// them), its keys' tokens and transposed group-major windows (the queries that see each key), the
// query rows' coordinates inside a query box (one byte an axis), and per query-box buffer (two:
// box u + 1 is staged while step u runs) the box's origin, its queries' tokens and whether it is
// full.
template <int kM, int kN>
struct DkDvTokenTileSmem {
  neighborhood::BlockTiles tiles;
  int full[2];
  int seen_origin[2][3];
  int key_token[kN];
  int2 key_window[kN][3];    // (lo, hi) per axis; lo > hi for keys past the grid
  unsigned query_local[kM];  // bytes 0-2: coordinates in the query box; byte 3: 0
  int query_token[2][kM];    // -1 for queries past the grid
};

// Writes the query box of step u (box u % boxes) into buffer u % 2; the caller's next barrier
// publishes it. Extra keys (`ranges`) take consecutive queries instead, all of which see them.
template <int kM, int kN>
__device__ __forceinline__ void stage_query_box(DkDvTokenTileSmem<kM, kN>* tt,
                                                const NeighborhoodGrid& g, std::int64_t u,
                                                std::int64_t boxes, bool ranges,
                                                std::int64_t num_queries) {
  const int box = static_cast<int>(u % boxes);
  if (ranges) {
    for (int c = static_cast<int>(threadIdx.x); c < kM; c += kThreads) {
      const std::int64_t i = static_cast<std::int64_t>(box) * kM + c;
      tt->query_token[u & 1][c] = i < num_queries ? static_cast<int>(i) : -1;
    }
    if (threadIdx.x == 0) tt->full[u & 1] = 1;
    return;
  }
  int origin[3];
  neighborhood::seen_box_origin(tt->tiles, box, origin);
  for (int c = static_cast<int>(threadIdx.x); c < kM; c += kThreads) {
    int yp[3];
    tt->query_token[u & 1][c] = neighborhood::box_token(g, tt->tiles.seen_shape, origin, c, yp);
  }
  if (threadIdx.x == 0) {
    for (int a = 0; a < 3; ++a) tt->seen_origin[u & 1][a] = origin[a];
    tt->full[u & 1] = neighborhood::seen_box_is_full(g, tt->tiles, box, kM, /*transposed=*/true);
  }
}

// A key's transposed window clipped to the query box of buffer `buffer`, as byte ranges
// (neighborhood::box_bounds_bytes).
template <int kM, int kN>
__device__ __forceinline__ void key_bounds_in_box(const DkDvTokenTileSmem<kM, kN>* tt, int key,
                                                  int buffer, unsigned* lo, unsigned* hi) {
  neighborhood::AxisWindow w[3];
  int origin[3];
#pragma unroll
  for (int a = 0; a < 3; ++a) {
    w[a] = {tt->key_window[key][a].x, tt->key_window[key][a].y};
    origin[a] = tt->seen_origin[buffer][a];
  }
  neighborhood::box_bounds_bytes(w, origin, tt->tiles.seen_shape, lo, hi);
}

// dQ += (x0, x1) at columns col, col + 1 of an fp32 accumulator row (`at`, col even; `second`:
// col + 1 is a column of the head). One 8-byte reduction where the GPU has them (sm90) and the
// pair is 8-byte aligned (`aligned`), otherwise a 4-byte atomic per column.
__device__ __forceinline__ void add_pair(float* at, float x0, float x1, bool second, bool aligned) {
#if __CUDA_ARCH__ >= 900
  if (second && aligned) {
    atomicAdd(reinterpret_cast<float2*>(at), make_float2(x0, x1));
    return;
  }
#endif
  atomicAdd(at, x0);
  if (second) atomicAdd(at + 1, x1);
}

// The kernel body; kSplit selects the 3xTF32 products for fp32 (tile_operands.cuh) and is false
// for 16-bit types.
template <typename T, int kD, typename Policy, bool kSplit>
__device__ __forceinline__ void backward_dkdv_body(const BackwardParams& p) {
  constexpr int kN = kBwdBlockN;
  constexpr int kM = bwd_block_m<T>(kD);
  constexpr int kC = bwd_chunk<T>(kD);
  constexpr int kPitch = smem_row<T>(kD);
  constexpr int kDsPitch = bwd_ds_row<T>(kD);
  constexpr int kStep = tile::kStepK<T>;  // k elements per product step (32 bytes)
  constexpr int kChunk = tile::kChunk<T>;
  constexpr int kScoreTiles = kM / 8;  // n8 tiles of a warp's 16 keys x kM queries
  constexpr int kAccTiles = kC / 8;    // n8 tiles of a warp's 16 keys x kC columns
  // Fused dQ: kM / 16 row blocks of queries, the kC columns split over the warps of a row block.
  constexpr int kRowBlocks = kM / 16;
  constexpr int kWarpsPerRowBlock = kWarps / kRowBlocks;
  constexpr int kDqCols = kC / kWarpsPerRowBlock;
  constexpr int kDqGroup = kDqCols % 32 == 0 ? 32 : 16;
  static_assert(kDqCols % kDqGroup == 0 && kDqGroup % 16 == 0, "dQ columns in whole k16 steps");
  using Mask = typename Policy::Mask;
  // Keys and queries gathered by token from grid boxes (neighborhood attention) instead of
  // sequence ranges; extra keys and the queries they meet are gathered too, as consecutive tokens.
  constexpr bool kTokenTiles = Mask::kTokenTiles;
  using Scores = typename Policy::template Scores<T>;
  using Convert = tile::Dtype<T>;
  using Elem = typename Convert::Storage;
  using Frag = tile::Frag<T, kSplit>;
  const ForwardParams& f = p.fwd;

  extern __shared__ __align__(16) std::uint8_t smem_bytes_[];
  Elem* const smem_q = reinterpret_cast<Elem*>(smem_bytes_);
  Elem* const smem_do = smem_q + kM * kPitch;
  Elem* const smem_k = smem_do + kM * kPitch;
  Elem* const smem_v = smem_k + kN * kPitch;
  // K and V split once for the exact mode's products: their lo planes follow V (kPresplitKV).
  constexpr bool kPresplitKV = kSplit && bwd_presplit_kv<T>(kD);
  constexpr std::uint32_t kKvLoBytes = 2 * kN * kPitch * sizeof(Elem);  // K -> K lo, V -> V lo
  Elem* const smem_ds = smem_v + (bwd_presplit_kv<T>(kD) ? 3 : 1) * kN * kPitch;
  float* const smem_lse = reinterpret_cast<float*>(smem_ds + kN * kDsPitch);
  float* const smem_delta = smem_lse + kM;
  auto* const tt = reinterpret_cast<DkDvTokenTileSmem<kM, kN>*>(smem_delta + kM);  // token tiles

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t b = blockIdx.z;
  const int hk = static_cast<int>(blockIdx.y);
  const int chunk = static_cast<int>(blockIdx.x) % p.num_chunks;
  const std::int64_t tile_index = blockIdx.x / p.num_chunks;
  const int col0 = chunk * kC;

  const SequenceRows rows_of_batch = sequence_rows(f, b);
  const std::int64_t q_start = rows_of_batch.q_start, k_start = rows_of_batch.k_start;
  const std::int64_t num_queries = rows_of_batch.num_queries, num_keys = rows_of_batch.num_keys;
  // Blocks [0, main_tiles) own ordinary keys (varlen: the longest sequence's count; token tiles:
  // one key box each), the rest extra keys.
  const std::int64_t main_tiles =
      kTokenTiles ? neighborhood::num_block_boxes(f.neighborhood, kN) : (f.seqlen_k + kN - 1) / kN;
  const bool extra = tile_index >= main_tiles;
  // Token tiles address a box's keys by token, so their pointers start at token 0.
  const std::int64_t n0 =
      extra ? (tile_index - main_tiles) * kN : (kTokenTiles ? 0 : tile_index * kN);
  const std::int64_t key_count = extra ? f.num_extra : num_keys;
  if (n0 >= key_count) return;  // varlen: this sequence has fewer keys than the longest
  // Rows of a key box are valid by token, not by count.
  const int valid_keys =
      kTokenTiles && !extra ? kN : static_cast<int>(key_count - n0 < kN ? key_count - n0 : kN);

  const Elem* k_tile;
  const Elem* v_tile;
  std::int64_t k_row_stride, v_row_stride;
  if (extra) {
    k_tile = static_cast<const Elem*>(f.extra_k) + b * f.extra_k_batch_stride +
             n0 * f.extra_k_row_stride + hk * f.extra_k_head_stride;
    v_tile = static_cast<const Elem*>(f.extra_v) + b * f.extra_v_batch_stride +
             n0 * f.extra_v_row_stride + hk * f.extra_v_head_stride;
    k_row_stride = f.extra_k_row_stride;
    v_row_stride = f.extra_v_row_stride;
  } else {
    k_tile = static_cast<const Elem*>(f.k) + b * f.k_batch_stride +
             (k_start + n0) * f.k_row_stride + hk * f.k_head_stride;
    v_tile = static_cast<const Elem*>(f.v) + b * f.v_batch_stride +
             (k_start + n0) * f.v_row_stride + hk * f.v_head_stride;
    k_row_stride = f.k_row_stride;
    v_row_stride = f.v_row_stride;
  }

  const Mask mask = Mask::make(f, num_queries, num_keys);
  // Extra keys are visible to every query; ordinary keys to the mask's transposed range.
  std::int64_t first_m = 0, m_tiles = 0;
  if constexpr (kTokenTiles) {
    // The block's key box, its keys' tokens and transposed windows, the query boxes that see it;
    // extra keys: consecutive keys (tokens relative to the tile) and consecutive query tiles.
    if (!extra && threadIdx.x == 0) {
      tt->tiles = neighborhood::block_tiles(f.neighborhood, static_cast<int>(tile_index), kN, kM,
                                            /*transposed=*/true);
    }
    __syncthreads();
    for (int r = static_cast<int>(threadIdx.x); r < kN; r += kThreads) {
      int yp[3];
      const int token = extra ? (r < valid_keys ? r : -1)
                              : neighborhood::box_token(f.neighborhood, tt->tiles.box_shape,
                                                        tt->tiles.box_origin, r, yp);
      tt->key_token[r] = token;
      for (int a = 0; a < 3; ++a) {
        const neighborhood::AxisWindow w =
            token >= 0 && !extra ? neighborhood::group_major_window(f.neighborhood, a, yp[a], true)
                                 : neighborhood::AxisWindow{1, 0};
        tt->key_window[r][a] = make_int2(w.lo, w.hi);
      }
    }
    for (int r = static_cast<int>(threadIdx.x); r < kM && !extra; r += kThreads) {
      tt->query_local[r] = neighborhood::box_local_bytes(tt->tiles.seen_shape, r);
    }
    m_tiles = extra ? (num_queries + kM - 1) / kM : tt->tiles.num_seen_tiles;
    if (m_tiles > 0) stage_query_box(tt, f.neighborhood, 0, m_tiles, extra, num_queries);
    __syncthreads();
  } else {
    QueryRange rows_range{0, num_queries};
    if (!extra) rows_range = query_range(mask, n0, n0 + valid_keys - 1, num_queries);
    if (rows_range.end > rows_range.begin) {
      first_m = rows_range.begin / kM;
      m_tiles = (rows_range.end + kM - 1) / kM - first_m;
    }
  }
  const std::int64_t num_steps = m_tiles * f.kv_group;

  // Step u: query head h0 + u / m_tiles, query tile first_m + u % m_tiles.
  auto step_head = [&](std::int64_t u) { return hk * f.kv_group + static_cast<int>(u / m_tiles); };
  // Token tiles address queries by token: their tiles start at token 0.
  auto step_m0 = [&](std::int64_t u) { return kTokenTiles ? 0 : (first_m + u % m_tiles) * kM; };
  auto load_step = [&](std::int64_t u) {
    const int h = step_head(u);
    if constexpr (kTokenTiles) {  // the queries of box u, staged in buffer u % 2
      const int* tokens = tt->query_token[u & 1];
      const auto* q = static_cast<const Elem*>(f.q) + b * f.q_batch_stride + h * f.q_head_stride;
      const auto* dout =
          static_cast<const Elem*>(p.dout) + b * p.dout_batch_stride + h * p.dout_head_stride;
      load_rows_async<T, kM, kD>(smem_q, q, f.q_row_stride, tokens, 1, f.head_dim, f.vector_loads);
      load_rows_async<T, kM, kD>(smem_do, dout, p.dout_row_stride, tokens, 1, f.value_dim,
                                 f.vector_loads);
      const std::int64_t stat = b * p.stat_batch_stride + h * p.stat_head_stride;
      for (int r = static_cast<int>(threadIdx.x); r < kM; r += kThreads) {
        const int token = tokens[r];
        smem_lse[r] = token >= 0 ? p.lse_log2[stat + token] : INFINITY;  // past the grid: P = 0
        smem_delta[r] = token >= 0 ? p.delta[stat + token] : 0.0f;
      }
      return;
    }
    const std::int64_t m0 = step_m0(u);
    const int rows = static_cast<int>(num_queries - m0 < kM ? num_queries - m0 : kM);
    const auto* q = static_cast<const Elem*>(f.q) + b * f.q_batch_stride +
                    (q_start + m0) * f.q_row_stride + h * f.q_head_stride;
    const auto* dout = static_cast<const Elem*>(p.dout) + b * p.dout_batch_stride +
                       (q_start + m0) * p.dout_row_stride + h * p.dout_head_stride;
    load_tile_async<T, kM, kD>(smem_q, q, f.q_row_stride, rows, f.head_dim, f.vector_loads);
    load_tile_async<T, kM, kD>(smem_do, dout, p.dout_row_stride, rows, f.value_dim, f.vector_loads);
    const std::int64_t stat = b * p.stat_batch_stride + h * p.stat_head_stride + q_start + m0;
    for (int r = static_cast<int>(threadIdx.x); r < kM; r += kThreads) {
      smem_lse[r] = r < rows ? p.lse_log2[stat + r] : INFINITY;  // rows past the end: P = 0
      smem_delta[r] = r < rows ? p.delta[stat + r] : 0.0f;
    }
  };

  if constexpr (kTokenTiles) {
    load_rows_async<T, kN, kD>(smem_k, k_tile, k_row_stride, tt->key_token, 1, f.head_dim,
                               f.vector_loads);
    load_rows_async<T, kN, kD>(smem_v, v_tile, v_row_stride, tt->key_token, 1, f.value_dim,
                               f.vector_loads);
  } else {
    load_tile_async<T, kN, kD>(smem_k, k_tile, k_row_stride, valid_keys, f.head_dim,
                               f.vector_loads);
    load_tile_async<T, kN, kD>(smem_v, v_tile, v_row_stride, valid_keys, f.value_dim,
                               f.vector_loads);
  }
  if (num_steps > 0) load_step(0);
  tile::cp_async_commit();

  constexpr std::uint32_t kBytes = sizeof(Elem);
  // A operands (K, V: this warp's 16 keys): lanes 0-15 rows 0-15 at chunk 0, 16-31 at chunk 1
  // (16-byte chunks: 8 elements of a 16-bit type, 4 floats).
  const int a_row = warp * 16 + lane % 16, a_col = (lane / 16) * kChunk;
  const std::uint32_t k_a = tile::shared_address(smem_k + a_row * kPitch + a_col);
  const std::uint32_t v_a = tile::shared_address(smem_v + a_row * kPitch + a_col);
  // B operands with n = query row (Q, dO as stored): matrices (rows 0-7, chunk 0), (0-7, 1),
  // (8-15, 0), (8-15, 1).
  const int bn_row = (lane / 16) * 8 + lane % 8, bn_col = ((lane / 8) % 2) * kChunk;
  const std::uint32_t q_bn = tile::shared_address(smem_q + bn_row * kPitch + bn_col);
  const std::uint32_t do_bn = tile::shared_address(smem_do + bn_row * kPitch + bn_col);
  // B operands with k = query row (Q, dO): column loads (tile_operands.cuh).
  const int bk_lane = tile::b_cols_lane_offset<T, kPitch>(lane);
  const std::uint32_t q_bk = tile::shared_address(smem_q + bk_lane + col0);
  const std::uint32_t do_bk = tile::shared_address(smem_do + bk_lane + col0);

  // K / V fragments: split as they load, or loaded already split.
  auto load_kv_rows = [&](Frag& f, std::uint32_t address) {
    if constexpr (kPresplitKV) {
      tile::load_rows_presplit(f, address, kKvLoBytes);
    } else {
      tile::load_rows(f, address);
    }
  };
  auto load_k_cols = [&](Frag& f, std::uint32_t address) {
    if constexpr (kPresplitKV) {
      tile::load_b_cols_presplit<kPitch>(f, address, kKvLoBytes);
    } else {
      tile::load_b_cols<T, kPitch>(f, address);
    }
  };

  const int g = lane / 4;         // fragment row (key) within the warp's 16, +8 for e >= 2
  const int c2 = 2 * (lane % 4);  // fragment column (query) within an n8 tile, +1 for odd e
  const std::int64_t key_row = n0 + warp * 16 + g;

  float dk[kAccTiles][4], dv[kAccTiles][4];
#pragma unroll
  for (int t = 0; t < kAccTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[t][e] = dv[t][e] = 0.0f;
  }

  for (std::int64_t u = 0; u < num_steps; ++u) {
    const int h = step_head(u);
    const std::int64_t m0 = step_m0(u);
    tile::cp_async_wait<0>();
    __syncthreads();  // Q/dO/lse(u) visible; the previous step's dQ is done with dS^T
    if constexpr (kPresplitKV) {
      if (u == 0) {  // K and V landed with the first step's tiles
        tile::split_tile_in_place<kN, kD, kPitch, kThreads>(smem_k, kKvLoBytes);
        tile::split_tile_in_place<kN, kD, kPitch, kThreads>(smem_v, kKvLoBytes);
        __syncthreads();
      }
    }
    if constexpr (kTokenTiles) {
      // Query box u + 1 into the other buffer, last read by step u - 1's dQ before the barrier.
      if (u + 1 < num_steps) {
        stage_query_box(tt, f.neighborhood, u + 1, m_tiles, extra, num_queries);
      }
    }

    float s[kScoreTiles][4], dp[kScoreTiles][4];
#pragma unroll
    for (int t = 0; t < kScoreTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] = dp[t][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kD / kStep; ++kk) {
      if (kk * kStep >= f.head_dim) break;  // zero columns of the bucket
      Frag a;
      load_kv_rows(a, k_a + kk * kStep * kBytes);
#pragma unroll
      for (int np = 0; np < kScoreTiles / 2; ++np) {
        Frag bq;
        tile::load_rows(bq, q_bn + (np * 16 * kPitch + kk * kStep) * kBytes);
        tile::mma_fresh<kD / kStep>(s[2 * np], a, bq, 0);
        tile::mma_fresh<kD / kStep>(s[2 * np + 1], a, bq, 1);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kD / kStep; ++kk) {
      if (kk * kStep >= f.value_dim) break;
      Frag a;
      load_kv_rows(a, v_a + kk * kStep * kBytes);
#pragma unroll
      for (int np = 0; np < kScoreTiles / 2; ++np) {
        Frag bo;
        tile::load_rows(bo, do_bn + (np * 16 * kPitch + kk * kStep) * kBytes);
        tile::mma_fresh<kD / kStep>(dp[2 * np], a, bo, 0);
        tile::mma_fresh<kD / kStep>(dp[2 * np + 1], a, bo, 1);
      }
    }

    // P^T in s, dS^T in dp. Rows past Lq and fully masked rows have lse_log2 = +inf: P = 0.
    const Scores scores = Scores::make(f, b, h, num_queries, num_keys);
    const bool additive = !extra && has_additive(scores);
    // dS is the same in every column chunk's block: its sums into dbias / drel are the first's.
    const bool additive_grad = !extra && chunk == 0 && has_additive_grad(p);
    if constexpr (kTokenTiles) {
      // Per key of this thread (entries 0, 1 on key row g, 2, 3 on g + 8), the queries of box u
      // inside its transposed window on every axis (all of them on a full box): a few byte
      // compares against the query's box coordinates. Tokens index the bias and its gradient;
      // keys and queries past the grid have neither (queries past it have lse +inf: P = 0).
      const bool full = tt->full[u & 1] != 0;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int kr = warp * 16 + g + 8 * half;
        const int key = tt->key_token[kr];
        unsigned lo = 0, hi = 0;  // only partial boxes test (extra keys stage no box geometry)
        if (!full) key_bounds_in_box(tt, kr, static_cast<int>(u & 1), &lo, &hi);
#pragma unroll
        for (int t = 0; t < kScoreTiles; ++t) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int e = 2 * half + c;
            const int r = t * 8 + c2 + c;  // query row within the box
            float grad;
            float x = score_with_grad(scores, s[t][e], &grad);
            const int query = additive || additive_grad ? tt->query_token[u & 1][r] : -1;
            if (additive && query >= 0 && key >= 0) x += additive_log2(scores, query, key);
            bool visible = key >= 0;
            if (!full) {
              const unsigned local = tt->query_local[r];
              visible = visible && neighborhood::bytes_within(local, lo, hi);
            }
            const float prob = visible ? exp2f(x - smem_lse[r]) : 0.0f;
            const float ds = prob * (dp[t][e] - smem_delta[r]);  // wrt the final score
            if (additive_grad && query >= 0 && key >= 0 && prob != 0.0f) {
              accumulate_additive_grad(p, b, h, query, key, ds);
            }
            s[t][e] = prob;
            dp[t][e] = ds * grad;
          }
        }
      }
    } else {
      using QueryTest = decltype(visible_queries(mask, std::int64_t{}, std::int64_t{}, 0));
      // Queries of the tile that see each of this thread's two keys (all of them for an extra key).
      QueryTest seen[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const std::int64_t j = key_row + 8 * half;
        if (extra) {
          seen[half] = j - n0 < valid_keys ? QueryTest::prefix(kM) : QueryTest::prefix(0);
        } else {
          seen[half] = visible_queries(mask, j, m0, kM);
        }
      }
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = t * 8 + c2 + (e & 1);  // query row within the tile
          float grad;
          float x = score_with_grad(scores, s[t][e], &grad);
          if (additive) x += additive_log2(scores, m0 + r, key_row + (e >= 2 ? 8 : 0));
          const float prob = seen[e >> 1].contains(r) ? exp2f(x - smem_lse[r]) : 0.0f;
          const float ds = prob * (dp[t][e] - smem_delta[r]);  // wrt the final score
          if (additive_grad && prob != 0.0f) {
            accumulate_additive_grad(p, b, h, m0 + r, key_row + (e >= 2 ? 8 : 0), ds);
          }
          s[t][e] = prob;
          dp[t][e] = ds * grad;
        }
      }
    }

    // dV += P^T dO and dK += dS^T Q over this block's column chunk; the score accumulators of
    // the step's query columns are the A fragments.
#pragma unroll
    for (int kk = 0; kk < kM / kStep; ++kk) {
      Frag ap, ads;
      tile::from_accumulators(ap, s, kk);
      tile::from_accumulators(ads, dp, kk);
#pragma unroll
      for (int np = 0; np < kC / 16; ++np) {
        const int col = col0 + np * 16;
        if (col < f.value_dim) {
          Frag bo;
          tile::load_b_cols<T, kPitch>(bo, do_bk + (kk * kStep * kPitch + np * 16) * kBytes);
          tile::mma(dv[2 * np], ap, bo, 0);
          tile::mma(dv[2 * np + 1], ap, bo, 1);
        }
        if (col < f.head_dim) {
          Frag bq;
          tile::load_b_cols<T, kPitch>(bq, q_bk + (kk * kStep * kPitch + np * 16) * kBytes);
          tile::mma(dk[2 * np], ads, bq, 0);
          tile::mma(dk[2 * np + 1], ads, bq, 1);
        }
      }
      if (p.dq_accum != nullptr) {
        // dS^T rows of this warp's keys, for the dQ product: 16-bit query pairs as the packed
        // words of the A fragment; fp32 unsplit from the accumulators (the dQ product splits its
        // own fragments).
        Elem* ds_row = smem_ds + (warp * 16 + g) * kDsPitch + kk * kStep + c2;
        if constexpr (tile::kIsFloat<T>) {
          tile::store_pair<T>(ds_row, dp[kk][0], dp[kk][1]);
          tile::store_pair<T>(ds_row + 8 * kDsPitch, dp[kk][2], dp[kk][3]);
        } else {
          *reinterpret_cast<std::uint32_t*>(ds_row) = ads.x[0];
          *reinterpret_cast<std::uint32_t*>(ds_row + 8 * kDsPitch) = ads.x[1];
          *reinterpret_cast<std::uint32_t*>(ds_row + 8) = ads.x[2];
          *reinterpret_cast<std::uint32_t*>(ds_row + 8 * kDsPitch + 8) = ads.x[3];
        }
      }
    }

    __syncthreads();  // every warp is done with Q/dO/lse(u); dS^T(u) visible
    if (u + 1 < num_steps) load_step(u + 1);
    tile::cp_async_commit();

    if (p.dq_accum != nullptr) {
      // dQ[kM x kC] += dS [kM x kN] K [kN x kC]: warp -> (row block, column slice).
      const int row_block = warp % kRowBlocks;
      const int slice = col0 + (warp / kRowBlocks) * kDqCols;
      // A = dS from dS^T ([key][query]) and B = K ([key][d]) through column loads.
      const std::uint32_t ds_a = tile::shared_address(
          smem_ds + tile::a_cols_lane_offset<T, kDsPitch>(lane) + row_block * 16);
      const std::uint32_t k_bk = tile::shared_address(smem_k + bk_lane + slice);
      float* accum = p.dq_accum + b * p.accum_batch_stride + h * p.accum_head_stride +
                     (q_start + m0) * p.accum_row_stride;
      // Column pairs as one 8-byte reduction where the strides keep them aligned (the
      // accumulator itself starts 16-byte aligned).
      const bool pairs = p.accum_row_stride % 2 == 0 && p.accum_head_stride % 2 == 0 &&
                         p.accum_batch_stride % 2 == 0;
      // 32 columns at a time: a small accumulator next to the live dK/dV ones.
#pragma unroll
      for (int group = 0; group < kDqCols / kDqGroup; ++group) {
        const int group_col = slice + group * kDqGroup;
        if (group_col >= f.head_dim) break;
        float acc[kDqGroup / 8][4];
#pragma unroll
        for (int t = 0; t < kDqGroup / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < kN / kStep; ++kk) {
          Frag a;
          tile::load_a_cols<T, kDsPitch>(a, ds_a + kk * kStep * kDsPitch * kBytes);
#pragma unroll
          for (int np = 0; np < kDqGroup / 16; ++np) {
            if (group_col + np * 16 >= f.head_dim) break;
            Frag bk;
            load_k_cols(bk, k_bk + (kk * kStep * kPitch + group * kDqGroup + np * 16) * kBytes);
            tile::mma_fresh<kN / kStep>(acc[2 * np], a, bk, 0);
            tile::mma_fresh<kN / kStep>(acc[2 * np + 1], a, bk, 1);
          }
        }
#pragma unroll
        for (int t = 0; t < kDqGroup / 8; ++t) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {  // rows g and g + 8: entries 2 half, 2 half + 1
            const int r = row_block * 16 + g + 8 * half;
            const int col = group_col + t * 8 + c2;
            // The query's row of the accumulator; < 0: none.
            std::int64_t row;
            if constexpr (kTokenTiles) {  // by token (accum starts at token 0)
              row = tt->query_token[u & 1][r];
            } else {
              row = m0 + r < num_queries ? r : -1;
            }
            if (row >= 0 && col < f.head_dim) {
              add_pair(accum + row * p.accum_row_stride + col, acc[t][2 * half],
                       acc[t][2 * half + 1], col + 1 < f.head_dim, pairs);
            }
          }
        }
      }
    }
  }

  tile::cp_async_wait<0>();  // K/V are still in flight when no query tile saw these keys

  // Epilogue: dK (times the scale, the chain rule's last factor) and dV of this warp's keys.
  void* const dk_out = extra ? p.dextra_k : p.dk;
  void* const dv_out = extra ? p.dextra_v : p.dv;
  const std::int64_t row0 = extra ? n0 : k_start + n0;
  auto* dk_base = static_cast<Elem*>(dk_out);
  auto* dv_base = static_cast<Elem*>(dv_out);
  std::int64_t dk_rs, dv_rs;
  if (extra) {
    dk_base += b * p.dextra_k_batch_stride + hk * p.dextra_k_head_stride;
    dv_base += b * p.dextra_v_batch_stride + hk * p.dextra_v_head_stride;
    dk_rs = p.dextra_k_row_stride;
    dv_rs = p.dextra_v_row_stride;
  } else {
    dk_base += b * p.dk_batch_stride + hk * p.dk_head_stride;
    dv_base += b * p.dv_batch_stride + hk * p.dv_head_stride;
    dk_rs = p.dk_row_stride;
    dv_rs = p.dv_row_stride;
  }
#pragma unroll
  for (int t = 0; t < kAccTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = warp * 16 + g + (e >= 2 ? 8 : 0);
      const int col = col0 + t * 8 + c2 + (e & 1);
      if (r >= valid_keys) continue;
      // Token tiles: the key's token, relative to row0 (0 for key boxes; -1: past the grid).
      const std::int64_t row = kTokenTiles ? row0 + tt->key_token[r] : row0 + r;
      if (kTokenTiles && tt->key_token[r] < 0) continue;
      if (dk_out != nullptr && col < f.head_dim) {
        dk_base[row * dk_rs + col] = Convert::from_float(dk[t][e] * p.scale);
      }
      if (dv_out != nullptr && col < f.value_dim) {
        dv_base[row * dv_rs + col] = Convert::from_float(dv[t][e]);
      }
    }
  }
}

template <typename T, int kD, typename Policy>
__global__ void __launch_bounds__(kThreads)
    backward_dkdv_kernel(const __grid_constant__ BackwardParams p) {
  if constexpr (tile::kIsFloat<T>) {
    // allow_tf32 is a runtime option: one uniform branch here, none in the loops.
    if (p.fwd.allow_tf32) {
      backward_dkdv_body<T, kD, Policy, false>(p);
    } else {
      backward_dkdv_body<T, kD, Policy, true>(p);
    }
  } else {
    backward_dkdv_body<T, kD, Policy, false>(p);
  }
}

}  // namespace fmha::cuda::sm80
