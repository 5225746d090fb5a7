// Neighborhood-attention bookkeeping of the sm90 kernels (kTokenTiles masks: a block's own rows
// are a box of the token grid, the rows it meets are the boxes of the region they see, every row
// gathered by token; neighborhood_mask.cuh has the geometry). Two views of one tiling:
//   queries own (the forward and the dQ kernel): TokenTileSmem, the block's query box with each
//     row's window, and a ring of key boxes; gathered_scores tests a score tile against them.
//   keys own (the dK/dV kernel): KeyBoxSmem, the block's key box with each key's transposed window
//     (the queries that see it), and a ring of query boxes; hide_unseen_transposed tests S^T.
// Every thread of the block calls the init_* and stage_* functions; init_query_box publishes what
// it writes with its own barrier, for the others the caller's next barrier does.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/forward_policies.cuh"
#include "cuda/common/neighborhood_mask.cuh"

namespace fmha::cuda::sm90 {

// Shared-memory bookkeeping of a kTokenTiles mask (neighborhood attention): the block's boxes,
// its query rows' tokens and group-major windows, and per staged key box (a ring of kSlots: box
// u + stages is staged at rendezvous u, one rendezvous before its loads are issued) its keys'
// tokens, its group-major origin and whether every query sees it whole. Box j is last read by the
// follower's softmax of tile j, after rendezvous j + 1, so the ring holds stages + 2 boxes.
template <int kM, int kN>
struct TokenTileSmem {
  static constexpr int kSlots = 5;
  neighborhood::BlockTiles tiles;
  int4 key_box[kSlots];  // (y'0, y'1, y'2) of the origin, full
  int key_token[kSlots][kN];
  int query_token[kM];       // -1 past the grid or on a hole
  int2 query_window[kM][3];  // (lo, hi) per axis; lo > hi for rows without a token
};

// Writes key box u into its slot (every thread of the block calls it; the caller's next barrier
// publishes it).
template <int kM, int kN, int kThreads>
__device__ __forceinline__ void stage_key_box(TokenTileSmem<kM, kN>* tt, const NeighborhoodGrid& g,
                                              int u) {
  const int slot = u % TokenTileSmem<kM, kN>::kSlots;
  int origin[3];
  neighborhood::seen_box_origin(tt->tiles, u, origin);
  for (int c = static_cast<int>(threadIdx.x); c < kN; c += kThreads) {
    int yp[3];
    tt->key_token[slot][c] = neighborhood::box_token(g, tt->tiles.seen_shape, origin, c, yp);
  }
  if (threadIdx.x == kThreads - 1) {  // a thread without a token when kN < kThreads
    tt->key_box[slot] = make_int4(origin[0], origin[1], origin[2],
                                  neighborhood::seen_box_is_full_at(tt->tiles, origin, kN));
  }
}

// The block's query box `block`: its tiles, its rows' tokens and group-major windows, and key
// boxes 0 .. stages - 1, published by a block barrier; returns the number of key boxes.
template <int kM, int kN, int kThreads>
__device__ __forceinline__ int init_query_box(TokenTileSmem<kM, kN>* tt, const NeighborhoodGrid& g,
                                              int block, int stages) {
  if (threadIdx.x == 0) tt->tiles = neighborhood::block_tiles(g, block, kM, kN);
  __syncthreads();
  for (int r = static_cast<int>(threadIdx.x); r < kM; r += kThreads) {
    neighborhood::AxisWindow w[3];
    tt->query_token[r] = neighborhood::own_box_entry(g, tt->tiles, r, /*transposed=*/false, w);
    for (int a = 0; a < 3; ++a) tt->query_window[r][a] = make_int2(w[a].lo, w[a].hi);
  }
  const int boxes = tt->tiles.num_seen_tiles;
  for (int u = 0; u < stages && u < boxes; ++u) stage_key_box<kM, kN, kThreads>(tt, g, u);
  __syncthreads();
  return boxes;
}

// Scores of a warp's rows against gathered key box `slot`: bias / rel-pos by token, then (partial
// boxes) -inf where a key lies outside the row's window on some axis. This thread's entries 0, 1
// sit on block row `row`, 2, 3 on row + 8; entry c of n8 tile t is key col + 8t + c of the box.
// The test is byte-wise: a key's coordinates inside its box (powers of two per axis: shifts and
// masks of the key's index) against the row's window clipped to the box, one byte an axis, all
// below 128, so one subtraction per bound compares the four bytes at once (their high bits carry
// the answers, no borrow crosses a byte).
template <typename Scores, int kM, int kN, int kTiles>
__device__ __forceinline__ void gathered_scores(const TokenTileSmem<kM, kN>* tt, int slot,
                                                const Scores& scores, float (&s)[kTiles][4],
                                                int row, int col) {
  constexpr unsigned kHigh = 0x80808080u;
  static_assert(kN <= 128, "box coordinates below 128");
  const int4 box = tt->key_box[slot];
  const bool additive = has_additive(scores);
  if (box.w != 0 && !additive) return;
  if (additive) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int query = tt->query_token[row + 8 * half];
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
  const int shape[3] = {tt->tiles.seen_shape[0], tt->tiles.seen_shape[1], tt->tiles.seen_shape[2]};
  const int origin[3] = {box.x, box.y, box.z};
  unsigned lo[2], hi[2];  // per row: the window clipped to the box, byte a = axis a
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    lo[half] = 0;
    hi[half] = kHigh;
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      const int2 w = tt->query_window[row + 8 * half][a];
      int l = neighborhood::max_int(w.x - origin[a], 0);
      int h = neighborhood::min_int(w.y - origin[a], shape[a] - 1);
      if (l > h) l = 127, h = 0;
      lo[half] |= static_cast<unsigned>(l) << (8 * a);
      hi[half] |= static_cast<unsigned>(h) << (8 * a);
    }
  }
  const int shift2 = neighborhood::log2_pow2(shape[2]);
  const int shift1 = shift2 + neighborhood::log2_pow2(shape[1]);
  const unsigned mask1 = static_cast<unsigned>(shape[1] - 1),
                 mask2 = static_cast<unsigned>(shape[2] - 1);
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const unsigned key = static_cast<unsigned>(col + 8 * t + c);
      const unsigned x = key >> shift1 | ((key >> shift2) & mask1) << 8 | (key & mask2) << 16;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const unsigned within = ((x | kHigh) - lo[half]) & (hi[half] - x) & kHigh;
        if (within != kHigh) s[t][2 * half + c] = -INFINITY;
      }
    }
  }
}

// The dK/dV kernel's view: its key box (kN keys), each key's token and transposed group-major
// window, the query rows' coordinates inside a query box (one byte an axis; every query box has
// the same shape), and a ring of kSlots query boxes (box u + stages is staged at step u, its
// loads issued at step u + 1, its scores tested at step u + stages: the ring holds stages + 1).
template <int kM, int kN, int kSlots_>
struct KeyBoxSmem {
  static constexpr int kSlots = kSlots_;
  neighborhood::BlockTiles tiles;
  int4 query_box[kSlots];       // (y'0, y'1, y'2) of the origin, full
  int query_token[kSlots][kM];  // -1 past the grid or on a hole
  int key_token[kN];
  int2 key_window[kN][3];    // (lo, hi) per axis; lo > hi for keys without a token
  unsigned query_local[kM];  // bytes 0-2: coordinates in a query box (box_local_bytes)
};

// The block's key box `block`: its tiles (published by a block barrier here), its keys' tokens and
// transposed windows, and the query rows' box coordinates.
template <int kM, int kN, int kThreads, int kSlots>
__device__ __forceinline__ void init_key_box(KeyBoxSmem<kM, kN, kSlots>* tt,
                                             const NeighborhoodGrid& g, int block) {
  if (threadIdx.x == 0)
    tt->tiles = neighborhood::block_tiles(g, block, kN, kM, /*transposed=*/true);
  __syncthreads();
  for (int r = static_cast<int>(threadIdx.x); r < kN; r += kThreads) {
    neighborhood::AxisWindow w[3];
    tt->key_token[r] = neighborhood::own_box_entry(g, tt->tiles, r, /*transposed=*/true, w);
    for (int a = 0; a < 3; ++a) tt->key_window[r][a] = make_int2(w[a].lo, w[a].hi);
  }
  for (int r = static_cast<int>(threadIdx.x); r < kM; r += kThreads) {
    tt->query_local[r] = neighborhood::box_local_bytes(tt->tiles.seen_shape, r);
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
// sit on block key `key`, 2, 3 on key + 8; entry c of n8 tile t is query col + 8t + c of the box.
// Keys without a token need no test (their dK/dV rows are never stored), nor queries without one
// (their lse is +inf: P = 0).
template <int kM, int kN, int kSlots, int kTiles>
__device__ __forceinline__ void hide_unseen_transposed(const KeyBoxSmem<kM, kN, kSlots>* tt,
                                                       int slot, float (&s)[kTiles][4], int key,
                                                       int col) {
  const int4 box = tt->query_box[slot];
  if (box.w != 0) return;
  const int origin[3] = {box.x, box.y, box.z};
  const int(&shape)[3] = tt->tiles.seen_shape;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    neighborhood::AxisWindow w[3];
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      const int2 bounds = tt->key_window[key + 8 * half][a];
      w[a] = {bounds.x, bounds.y};
    }
    unsigned lo, hi;
    neighborhood::box_bounds_bytes(w, origin, shape, &lo, &hi);
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (!neighborhood::bytes_within(tt->query_local[col + 8 * t + c], lo, hi)) {
          s[t][2 * half + c] = -INFINITY;
        }
      }
    }
  }
}

}  // namespace fmha::cuda::sm90
