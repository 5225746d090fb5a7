// Neighborhood-attention bookkeeping of the sm90 kernels (kTokenTiles masks: a block's own rows
// are a box of the token grid, the rows it meets are the boxes of the region they see, every row
// gathered by token; neighborhood_mask.cuh has the geometry). Two views of one tiling:
//   queries own (the forward and the dQ kernel): TokenTileSmem, the block's query box with each
//     row's window, and a ring of key boxes; gathered_scores tests a score tile against them.
//   keys own (the dK/dV kernel): KeyBoxSmem, the block's key box with each key's transposed window
//     (the queries that see it), and a ring of query boxes; hide_unseen_transposed tests S^T.
// Every thread of the block calls the init_* functions and the dK/dV kernel's stage_query_box; the
// query-owning view's stage_own_query_box and stage_key_box take the threads that call them (all
// of the block, or the forward's copy warpgroup). init_query_box publishes what it writes with its
// own barrier, for the others the caller's next barrier (among the threads that read it) does.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/forward_policies.cuh"
#include "cuda/common/neighborhood_mask.cuh"

namespace fmha::cuda::sm90 {

// The per-quad prefix tables of neighborhood_mask.cuh's bit-mask test for the columns of a
// gathered tile of kTiles n8 tiles: boxes of at most 8 kTiles entries, so at most 8 kTiles + 5
// entries a quad.
template <int kTiles>
struct ColumnBits {
  static_assert(kTiles <= 16, "one bit a column of a thread: 32 bits");
  static constexpr int kEntries = 8 * kTiles + 5;
  static_assert(kEntries <= NeighborhoodGrid::kMaxColumnEntries, "the launcher's tables hold ours");
  unsigned prefix[4][kEntries];

  // The launcher's tables of boxes of its seen shape, made for kTiles tiles (set_token_tiles
  // derives the width from the type that holds this). Every thread of the block calls it; the
  // caller's next barrier publishes it.
  template <int kThreads>
  __device__ __forceinline__ void copy(const NeighborhoodGrid& g) {
    const int entries = neighborhood::prefix_entries(g.seen_shape);
    for (int e = static_cast<int>(threadIdx.x); e < 4 * entries; e += kThreads) {
      prefix[e & 3][e >> 2] = g.column_bits[e & 3][e >> 2];
    }
  }
};

// For the launcher of a kernel whose token-tile bookkeeping is `TokenTiles` (TokenTileSmem or
// KeyBoxSmem): the box shapes and column tables its blocks read (set_box_shapes), for the own box
// and gathered tiles of that type, so that the tables are for the width its ColumnBits copies
// without checking.
template <typename TokenTiles>
void set_token_tiles(NeighborhoodGrid& g) {
  neighborhood::set_box_shapes(g, TokenTiles::kOwnRows, TokenTiles::kSeenColumns);
}

// Sets to -inf the scores whose bit is clear: entries 0, 1 of tile t take bits 2t, 2t + 1 of
// seen[0], entries 2, 3 those of seen[1] (their row + 8).
template <int kTiles>
__device__ __forceinline__ void hide_unseen_bits(float (&s)[kTiles][4], const unsigned (&seen)[2]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (((seen[e / 2] >> (2 * t + (e & 1))) & 1u) == 0) s[t][e] = -INFINITY;
    }
  }
}

// A query box of the query-owning view: its tiles, its rows' tokens and group-major windows.
template <int kM>
struct QueryBoxSmem {
  neighborhood::BlockTiles tiles;
  int token[kM];       // -1 past the grid or on a hole
  int2 window[kM][3];  // (lo, hi) per axis; lo > hi for rows without a token
};

// Shared-memory bookkeeping of a kTokenTiles mask (neighborhood attention) where queries own the
// block: its query box (kQueryBoxes of them where a persistent block's copy warpgroup stages the
// next grid tile's box while the math warps still read the current one: box k in query[k % 2]),
// and per staged key box (a ring of kSlots, key box j of a block's boxes in slot j % kSlots, j
// counted over the block's grid tiles where they are several) its keys' tokens, its group-major
// origin and whether every query sees it whole. Key box j is last read by the softmax of tile j,
// which every warp has left once it has waited for phase j + 1; the stager of box j + kSlots is
// at most stages + 1 tiles ahead of the slowest reader (its warps' phase j + kSlots - stages - 1
// at least, in both schedules), so the ring holds stages + 2 boxes.
template <int kM, int kN, int kQueryBoxes = 1>
struct TokenTileSmem {
  static constexpr int kOwnRows = kM, kSeenColumns = kN;  // set_token_tiles
  static_assert(kSeenColumns % 8 == 0, "whole n8 tiles of columns");
  static constexpr int kSlots = 5;
  ColumnBits<kN / 8> columns;  // the key boxes' columns
  int4 key_box[kSlots];        // (y'0, y'1, y'2) of the origin, full
  int key_token[kSlots][kN];
  QueryBoxSmem<kM> query[kQueryBoxes];
};

// Writes key box `box` of the query box `qb` into ring slot `slot`, by kThreads threads (`thread`:
// this one's index among them); the caller's next barrier among them publishes it.
template <int kM, int kN, int kThreads, int kQueryBoxes>
__device__ __forceinline__ void stage_key_box(TokenTileSmem<kM, kN, kQueryBoxes>* tt,
                                              const QueryBoxSmem<kM>& qb, const NeighborhoodGrid& g,
                                              int box, int slot,
                                              int thread = static_cast<int>(threadIdx.x)) {
  int origin[3];
  neighborhood::seen_box_origin(qb.tiles, box, origin);
  for (int c = thread; c < kN; c += kThreads) {
    int yp[3];
    tt->key_token[slot][c] = neighborhood::box_token(g, qb.tiles.seen_shape, origin, c, yp);
  }
  if (thread == kThreads - 1) {  // a thread without a token when kN < kThreads
    tt->key_box[slot] = make_int4(origin[0], origin[1], origin[2],
                                  neighborhood::seen_box_is_full_at(qb.tiles, origin, kN));
  }
}

// The query box `block`: its tiles, then (after `sync`, a barrier of the kThreads threads that
// call it) its rows' tokens and group-major windows; the caller's next barrier publishes those.
template <int kM, int kThreads, typename Sync>
__device__ __forceinline__ void stage_own_query_box(QueryBoxSmem<kM>* qb, const NeighborhoodGrid& g,
                                                    int block, int thread, Sync&& sync) {
  neighborhood::block_tiles_parallel(g, block, /*transposed=*/false, &qb->tiles, thread);
  sync();
  for (int r = thread; r < kM; r += kThreads) {
    neighborhood::AxisWindow w[3];
    qb->token[r] = neighborhood::own_box_entry(g, qb->tiles, r, /*transposed=*/false, w);
    for (int a = 0; a < 3; ++a) qb->window[r][a] = make_int2(w[a].lo, w[a].hi);
  }
}

// A block's only query box `block` (every thread of the block): its tiles, its rows' tokens and
// windows, the column tables and key boxes 0 .. stages - 1 in slots 0 .., published by a block
// barrier; returns the number of key boxes.
template <int kM, int kN, int kThreads>
__device__ __forceinline__ int init_query_box(TokenTileSmem<kM, kN>* tt, const NeighborhoodGrid& g,
                                              int block, int stages) {
  QueryBoxSmem<kM>* const qb = &tt->query[0];
  stage_own_query_box<kM, kThreads>(qb, g, block, static_cast<int>(threadIdx.x),
                                    [] { __syncthreads(); });
  tt->columns.template copy<kThreads>(g);
  const int boxes = qb->tiles.num_seen_tiles;
  for (int u = 0; u < stages && u < boxes; ++u) {
    stage_key_box<kM, kN, kThreads>(tt, *qb, g, u, u % TokenTileSmem<kM, kN>::kSlots);
  }
  __syncthreads();
  return boxes;
}

// Scores of a warp's rows (of query box `qb`) against gathered key box `slot`: bias / rel-pos by
// token, then (partial boxes) -inf where a key lies outside the row's window on some axis. This
// thread's entries 0, 1 sit on block row `row`, 2, 3 on row + 8; entry c of n8 tile t is key col +
// 8t + c of the box. The test runs per row, not per score: the row's window clipped to the box
// picks the thread's visible columns from the prefix tables (ColumnBits), one bit a score.
template <typename Scores, int kM, int kN, int kQueryBoxes, int kTiles>
__device__ __forceinline__ void gathered_scores(const TokenTileSmem<kM, kN, kQueryBoxes>* tt,
                                                const QueryBoxSmem<kM>& qb, int slot,
                                                const Scores& scores, float (&s)[kTiles][4],
                                                int row, int col) {
  static_assert(kTiles == kN / 8, "a thread's columns of the whole tile");
  const int4 box = tt->key_box[slot];
  const bool additive = has_additive(scores);
  if (box.w != 0 && !additive) return;
  if (additive) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int query = qb.token[row + 8 * half];
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int key = tt->key_token[slot][col + 8 * t + c];
          if (query >= 0 && key >= 0) s[t][2 * half + c] += additive_log2(scores, query, key);
        }
      }
    }
    if (box.w != 0) return;
  }
  const int origin[3] = {box.x, box.y, box.z};
  unsigned seen[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    neighborhood::AxisWindow w[3];
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      const int2 bounds = qb.window[row + 8 * half][a];
      w[a] = {bounds.x, bounds.y};
    }
    seen[half] =
        neighborhood::visible_columns(tt->columns.prefix[col / 2], qb.tiles.seen_shape, origin, w);
  }
  hide_unseen_bits(s, seen);
}

// The dK/dV kernel's view: its key box (kN keys), each key's token and transposed group-major
// window, the query rows' coordinates inside a query box (one byte an axis; every query box has
// the same shape), and a ring of kSlots query boxes (box u + stages is staged at step u, its
// loads issued at step u + 1, its scores tested at step u + stages: the ring holds stages + 1).
template <int kM, int kN, int kSlots_>
struct KeyBoxSmem {
  static constexpr int kOwnRows = kN, kSeenColumns = kM;  // set_token_tiles
  static_assert(kSeenColumns % 8 == 0, "whole n8 tiles of columns");
  static constexpr int kSlots = kSlots_;
  neighborhood::BlockTiles tiles;
  int4 query_box[kSlots];       // (y'0, y'1, y'2) of the origin, full
  int query_token[kSlots][kM];  // -1 past the grid or on a hole
  int key_token[kN];
  int2 key_window[kN][3];      // (lo, hi) per axis; lo > hi for keys without a token
  ColumnBits<kM / 8> columns;  // the query boxes' columns
};

// The block's key box `block`: its tiles (published by a block barrier here), its keys' tokens and
// transposed windows, and the query boxes' column tables.
template <int kM, int kN, int kThreads, int kSlots>
__device__ __forceinline__ void init_key_box(KeyBoxSmem<kM, kN, kSlots>* tt,
                                             const NeighborhoodGrid& g, int block) {
  neighborhood::block_tiles_parallel(g, block, /*transposed=*/true, &tt->tiles);
  __syncthreads();
  tt->columns.template copy<kThreads>(g);
  for (int r = static_cast<int>(threadIdx.x); r < kN; r += kThreads) {
    neighborhood::AxisWindow w[3];
    tt->key_token[r] = neighborhood::own_box_entry(g, tt->tiles, r, /*transposed=*/true, w);
    for (int a = 0; a < 3; ++a) tt->key_window[r][a] = make_int2(w[a].lo, w[a].hi);
  }
}

// Writes query box `box` into the slot of step u.
template <int kM, int kN, int kThreads, int kSlots>
__device__ __forceinline__ void stage_query_box(KeyBoxSmem<kM, kN, kSlots>* tt,
                                                const NeighborhoodGrid& g, std::int64_t u,
                                                int box) {
  const int slot = static_cast<int>(u % kSlots);
  int origin[3];
  neighborhood::seen_box_origin(tt->tiles, box, origin);
  for (int c = static_cast<int>(threadIdx.x); c < kM; c += kThreads) {
    int yp[3];
    tt->query_token[slot][c] = neighborhood::box_token(g, tt->tiles.seen_shape, origin, c, yp);
  }
  if (threadIdx.x == kThreads - 1) {
    tt->query_box[slot] = make_int4(origin[0], origin[1], origin[2],
                                    neighborhood::seen_box_is_full_at(tt->tiles, origin, kM));
  }
}

// S^T of a warp's keys against the query box in `slot`: -inf where the query lies outside the
// key's transposed window on some axis (nothing to do on a full box). This thread's entries 0, 1
// sit on block key `key`, 2, 3 on key + 8; entry c of n8 tile t is query col + 8t + c of the box,
// tested per key through the prefix tables (ColumnBits) as in gathered_scores. Keys without a
// token need no test (their dK/dV rows are never stored), nor queries without one (their lse is
// +inf: P = 0).
template <int kM, int kN, int kSlots, int kTiles>
__device__ __forceinline__ void hide_unseen_transposed(const KeyBoxSmem<kM, kN, kSlots>* tt,
                                                       int slot, float (&s)[kTiles][4], int key,
                                                       int col) {
  static_assert(kTiles == kM / 8, "a thread's columns of the whole query box");
  const int4 box = tt->query_box[slot];
  if (box.w != 0) return;
  const int origin[3] = {box.x, box.y, box.z};
  unsigned seen[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    neighborhood::AxisWindow w[3];
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      const int2 bounds = tt->key_window[key + 8 * half][a];
      w[a] = {bounds.x, bounds.y};
    }
    seen[half] =
        neighborhood::visible_columns(tt->columns.prefix[col / 2], tt->tiles.seen_shape, origin, w);
  }
  hide_unseen_bits(s, seen);
}

}  // namespace fmha::cuda::sm90
