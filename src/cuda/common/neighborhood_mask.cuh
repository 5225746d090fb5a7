// Neighborhood attention (SPEC §6) as a mask policy.
//
// The forward tiles the token grid in multi-dimensional boxes (the "token tiles" below): a block's
// queries are a box of the grid, its keys the boxes of the region those queries see, gathered by
// token, so a block visits no key tile that lies outside every neighborhood and tests the rest
// with a few compares per element (or not at all, on boxes every query sees whole). The backward's
// dQ kernel does the same, and its dK/dV kernel the transpose (a block's keys are a box, its query
// tiles the boxes of the queries that see them). Only the dQ kernel at head-dim bucket 256, where
// the bookkeeping does not fit, walks the flattened row-major order: per-axis bounds of a block of
// consecutive tokens give the keys to visit, and per-token windows the exact test.
//
// Grids have fewer than 2^31 tokens (the host refuses larger ones), so the geometry is 32-bit
// integer arithmetic. Axes past the grid's rank have size 1, kernel 1 and dilation 1: every
// axis test passes on them, so the code always runs the three axes instead of branching on rank.
// The geometry is __host__ __device__ so that host tests can check it against the SPEC formula.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/forward_params.h"
#include "cuda/common/mask_policies.cuh"

namespace fmha::cuda {

namespace neighborhood {

__host__ __device__ __forceinline__ int min_int(int a, int b) {
  return a < b ? a : b;
}
__host__ __device__ __forceinline__ int max_int(int a, int b) {
  return a > b ? a : b;
}

// The key coordinates one query coordinate sees on one axis: lo, lo + d, ..., hi (inclusive, d the
// dilation, lo in the query's dilation group). Empty when hi < lo.
struct AxisWindow {
  int lo, hi;
};

// SPEC §6 for query coordinate x on axis r: group g = x mod d, position p = x div d, group length
// n = ceil((X - g) / d); positions start .. start + K - 1 with start = clamp(p - K/2, 0, n - K), or
// max(p - K + 1, 0) .. p when causal.
__host__ __device__ __forceinline__ AxisWindow axis_window(const NeighborhoodGrid& g, int r,
                                                           int x) {
  const int d = g.dilation[r], k = g.kernel[r];
  const int group = x % d, p = x / d;
  int first, last;
  if (g.causal[r]) {
    first = max_int(p - k + 1, 0);
    last = p;
  } else {
    const int n = (g.size[r] - group + d - 1) / d;  // >= k, since K * d <= X is validated
    first = min_int(max_int(p - k / 2, 0), n - k);
    last = first + k - 1;
  }
  return {group + d * first, group + d * last};
}

// Row-major coordinates of token `token` (axis 2 innermost).
struct Coords {
  int x[3];
};
__host__ __device__ __forceinline__ Coords coords_of(const NeighborhoodGrid& g, int token) {
  Coords c;
  c.x[2] = token % g.size[2];
  token /= g.size[2];
  c.x[1] = token % g.size[1];
  c.x[0] = token / g.size[1];
  return c;
}

// What one query sees, axis by axis.
struct RowWindow {
  AxisWindow axis[3];
};
__host__ __device__ __forceinline__ RowWindow row_window(const NeighborhoodGrid& g, int query) {
  const Coords c = coords_of(g, query);
  RowWindow w;
  for (int r = 0; r < 3; ++r) w.axis[r] = axis_window(g, r, c.x[r]);
  return w;
}

// A key is visible iff, on every axis, its coordinate lies in the window and in the query's group.
__host__ __device__ __forceinline__ bool window_sees(const NeighborhoodGrid& g, const RowWindow& w,
                                                     const Coords& key) {
  bool seen = true;
  for (int r = 0; r < 3; ++r) {
    const int y = key.x[r];
    seen = seen && y >= w.axis[r].lo && y <= w.axis[r].hi &&
           (g.dilation[r] == 1 || (y - w.axis[r].lo) % g.dilation[r] == 0);
  }
  return seen;
}

// A window that sees nothing: for rows past the last query, which are computed but never stored.
__host__ __device__ __forceinline__ RowWindow empty_window() {
  RowWindow w;
  for (int r = 0; r < 3; ++r) w.axis[r] = {1, 0};
  return w;
}

// ---- Multi-dimensional token tiles -------------------------------------------------------------
// A block's queries are a box of the grid and its key tiles are boxes of the key region those
// queries see, so a query tile needs few keys and no key tile lies outside every neighborhood.
// The backward's dK/dV kernel reads it transposed: a block's keys are a box, its query tiles
// boxes of the region of queries that see them.
// Boxes live in group-major coordinates: on an axis with dilation d and L = ceil(X / d) positions
// per group, coordinate y = g + d * p (group g, position p) maps to y' = g * L + p. A window is
// then one interval [g * L + first, g * L + last] of y', a box of consecutive y' holds neighbours,
// and keys of other groups fall outside every window: the per-element test is two compares an axis.
// y' with p >= n_g (groups shorter than L, when d does not divide X) are holes: no token.

__host__ __device__ __forceinline__ int group_positions(const NeighborhoodGrid& g, int r) {
  if (g.dilation[r] == 1) return g.size[r];                // no division on undilated axes
  return (g.size[r] + g.dilation[r] - 1) / g.dilation[r];  // L
}
// Group-major extent of axis r: d * L (>= X; the excess are holes).
__host__ __device__ __forceinline__ int group_major_extent(const NeighborhoodGrid& g, int r) {
  return g.dilation[r] * group_positions(g, r);
}
// The grid coordinate of group-major y' (>= 0), or -1 for a hole or past the extent. Without
// dilation y' is y: no division (this runs per gathered row of every tile).
__host__ __device__ __forceinline__ int grid_coordinate(const NeighborhoodGrid& g, int r, int yp) {
  if (g.dilation[r] == 1) return yp < g.size[r] ? yp : -1;
  const int positions = group_positions(g, r);
  if (yp >= g.dilation[r] * positions) return -1;
  const int y = yp / positions + g.dilation[r] * (yp % positions);
  return y < g.size[r] ? y : -1;
}
// The window of the query at group-major y', or transposed the queries that see the key at y', as
// group-major bounds. A hole takes its group's last position, which keeps both bounds
// non-decreasing in y'. Transposed (key at position t of its group): both window bounds grow with
// the query position p, so the queries form an interval. Non-causal: the window ends at or after
// t iff p >= t - K + 1 + K/2 (or always, when t < K, the window then starting at 0), and starts
// at or before t iff p <= t + K/2 (or always, when t >= n - K, the window never starting past
// n - K). Causal: max(p - K + 1, 0) <= t <= p iff t <= p <= t + K - 1.
// Without dilation y' is the coordinate itself (one group of X positions): no division. y' lies
// inside the axis's group-major extent.
__host__ __device__ __forceinline__ AxisWindow group_major_window(const NeighborhoodGrid& g, int r,
                                                                  int yp, bool transposed = false) {
  const int d = g.dilation[r], k = g.kernel[r];
  const bool dilated = d != 1;
  const int positions = dilated ? group_positions(g, r) : g.size[r];
  const int group = dilated ? yp / positions : 0;
  const int n = dilated ? (g.size[r] - group + d - 1) / d : g.size[r];  // >= k (K * d <= X)
  const int p = min_int(dilated ? yp % positions : yp, n - 1);
  int first, last;
  if (transposed && g.causal[r]) {
    first = p;
    last = min_int(p + k - 1, n - 1);
  } else if (transposed) {
    first = p >= k ? p - k + 1 + k / 2 : 0;
    last = p >= n - k ? n - 1 : min_int(p + k / 2, n - 1);
  } else if (g.causal[r]) {
    first = max_int(p - k + 1, 0);
    last = p;
  } else {
    first = min_int(max_int(p - k / 2, 0), n - k);
    last = first + k - 1;
  }
  return {group * positions + first, group * positions + last};
}

__host__ __device__ __forceinline__ int pow2_ceil(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

// Box shapes are powers of two: indices split by shifts and masks, counts by shifts.
__host__ __device__ __forceinline__ int log2_pow2(int x) {
#ifdef __CUDA_ARCH__
  return __ffs(x) - 1;
#else
  return __builtin_ctz(static_cast<unsigned>(x));
#endif
}

// Query box of `rows` (a power of two) tokens: powers of two per axis, grown in turn from the
// innermost axis while an axis still has room, so boxes stay about square (a square of side s sees
// (s + K - 1)^2 keys, a row of s^2 tokens K x (s^2 + K - 1)). Smaller than `rows` only when the
// whole grid fits.
__host__ __device__ __forceinline__ void block_box_shape(const NeighborhoodGrid& g, int rows,
                                                         int (&shape)[3]) {
  int cap[3], product = 1;
  for (int r = 0; r < 3; ++r) {
    shape[r] = 1;
    cap[r] = pow2_ceil(group_major_extent(g, r));
  }
  for (bool grew = true; grew && product < rows;) {
    grew = false;
    for (int r = 2; r >= 0; --r) {
      if (product < rows && 2 * shape[r] <= cap[r]) {
        shape[r] *= 2;
        product *= 2;
        grew = true;
      }
    }
  }
}

// Key box of at most `keys` (a power of two) tokens for query boxes of `box_shape`: of the
// power-of-two shapes no wider than an interior block's key region (query extent + K - 1 per
// axis), the one that cuts that region into the fewest boxes (each costs a whole tile of keys);
// ties go to the widest innermost axis (longer contiguous rows). Transposed (query boxes for a box
// of keys) alike: the queries that see a key span K positions as well.
__host__ __device__ __forceinline__ void seen_box_shape(const NeighborhoodGrid& g,
                                                        const int (&box_shape)[3], int keys,
                                                        int (&shape)[3]) {
  int region[3], cap[3];
  for (int r = 0; r < 3; ++r) {
    region[r] = min_int(box_shape[r] + g.kernel[r] - 1, group_major_extent(g, r));
    cap[r] = pow2_ceil(region[r]);
  }
  // Shapes as exponents, so that the box counts are shifts: thread 0 of every block runs this
  // search (up to about 125 candidates in 3-D), which divisions made microseconds long.
  int best = -1;
  for (int ea = 0; (1 << ea) <= cap[0] && (1 << ea) <= keys; ++ea) {
    for (int eb = 0; (1 << eb) <= cap[1] && (1 << (ea + eb)) <= keys; ++eb) {
      for (int ec = log2_pow2(min_int(cap[2], keys >> (ea + eb))); ec >= 0; --ec) {
        const int tiles = ((region[0] + (1 << ea) - 1) >> ea) *
                          ((region[1] + (1 << eb) - 1) >> eb) * ((region[2] + (1 << ec) - 1) >> ec);
        if (best < 0 || tiles < best) {
          best = tiles;
          shape[0] = 1 << ea;
          shape[1] = 1 << eb;
          shape[2] = 1 << ec;
        }
      }
    }
  }
}

// What a block works on: its own box (the forward's and the dQ kernel's queries, the dK/dV kernel's
// keys) and the region of tokens it sees (keys, or transposed the queries that see its keys) cut
// into boxes. Origins and extents are group-major.
// full_lo / full_hi: per axis, the seen boxes inside [full_lo, full_hi] are seen whole
// (seen_box_is_full); full_lo > full_hi where none is.
struct BlockTiles {
  int box_shape[3], box_origin[3];
  int seen_shape[3], seen_origin[3], seen_tiles[3];  // seen_tiles: boxes per axis
  int num_seen_tiles;
  int full_lo[3], full_hi[3];
};

__host__ __device__ __forceinline__ int num_block_boxes(const NeighborhoodGrid& g, int rows) {
  int shape[3];
  block_box_shape(g, rows, shape);
  int boxes = 1;
  for (int r = 0; r < 3; ++r) boxes *= (group_major_extent(g, r) + shape[r] - 1) / shape[r];
  return boxes;
}

// The seen tokens on axis r that every entry of an own box [first, last] meets, as group-major
// bounds [*lo, *hi] (empty: *lo > *hi), from the windows of its first and last entries (transposed
// ones for the transposed tiling). Forward (own box = queries): window bounds grow with y', so
// every query of the box sees [lo(last), hi(first)]; a query the box holds on a hole takes its
// group's last position, whose window holds real keys of that group only, so that interval has
// no hole, and it is empty when the box spans two groups (lo(last) then lies in the later one).
// Transposed (own box = keys): the queries that see every key are [lo(last), hi(first)] of the
// transposed windows, which hold real queries of the key's group; that needs real keys of one
// group (first and last in one group, last no hole), else nothing is seen whole. A box reaching
// past the axis's group-major extent has none either.
__host__ __device__ __forceinline__ void full_interval(const NeighborhoodGrid& g, int r, int first,
                                                       int last, AxisWindow first_window,
                                                       AxisWindow last_window, bool transposed,
                                                       int* lo, int* hi) {
  bool any = last < group_major_extent(g, r);
  if (any && transposed && g.dilation[r] != 1) {
    const int positions = group_positions(g, r), group = first / positions;
    const int n = (g.size[r] - group + g.dilation[r] - 1) / g.dilation[r];
    any = last / positions == group && last % positions < n;
  }
  *lo = any ? last_window.lo : 1;
  *hi = any ? first_window.hi : 0;
}

// Boxes of `shape` (a power of two) along axis r.
__host__ __device__ __forceinline__ int boxes_on_axis(const NeighborhoodGrid& g, int r, int shape) {
  return (group_major_extent(g, r) + shape - 1) >> log2_pow2(shape);
}

// Axis r of block_tiles for the block's box `index` along that axis (its shapes already set).
__host__ __device__ __forceinline__ void block_tiles_axis(const NeighborhoodGrid& g, int r,
                                                          int index, bool transposed,
                                                          BlockTiles& t) {
  const int extent = group_major_extent(g, r);
  t.box_origin[r] = index * t.box_shape[r];
  const int box_last = t.box_origin[r] + t.box_shape[r] - 1;
  const int last = min_int(box_last, extent - 1);
  // Both window bounds grow with y': the tokens the box sees lie between these two.
  const AxisWindow first_window = group_major_window(g, r, t.box_origin[r], transposed);
  const AxisWindow last_window = group_major_window(g, r, last, transposed);
  t.seen_origin[r] = first_window.lo;
  t.seen_tiles[r] =
      (last_window.hi - first_window.lo + t.seen_shape[r]) >> log2_pow2(t.seen_shape[r]);
  full_interval(g, r, t.box_origin[r], box_last, first_window, last_window, transposed,
                &t.full_lo[r], &t.full_hi[r]);
}

// The box index along axis r of block `block` (axis 2 fastest).
__host__ __device__ __forceinline__ int block_index_on_axis(const NeighborhoodGrid& g,
                                                            const int (&box_shape)[3], int block,
                                                            int r) {
  int inner = 1;
  for (int a = 2; a > r; --a) inner *= boxes_on_axis(g, a, box_shape[a]);
  const int index = block / inner;
  return r == 0 ? index : index % boxes_on_axis(g, r, box_shape[r]);
}

__host__ __device__ __forceinline__ void block_shapes(const NeighborhoodGrid& g, int rows, int keys,
                                                      BlockTiles& t) {
  if (g.box_shape[0] > 0) {  // found by the launcher (set_box_shapes) for these rows and keys
    for (int r = 0; r < 3; ++r) {
      t.box_shape[r] = g.box_shape[r];
      t.seen_shape[r] = g.seen_shape[r];
    }
  } else {
    block_box_shape(g, rows, t.box_shape);
    seen_box_shape(g, t.box_shape, keys, t.seen_shape);
  }
}

__host__ __device__ __forceinline__ BlockTiles block_tiles(const NeighborhoodGrid& g, int block,
                                                           int rows, int keys,
                                                           bool transposed = false) {
  BlockTiles t;
  block_shapes(g, rows, keys, t);
  t.num_seen_tiles = 1;
  for (int r = 2; r >= 0; --r) {
    block_tiles_axis(g, r, block_index_on_axis(g, t.box_shape, block, r), transposed, t);
    t.num_seen_tiles *= t.seen_tiles[r];
  }
  return t;
}

#ifdef __CUDACC__
// block_tiles into shared memory by threads 0-2 of those that call it (`thread`: this one's index
// among them, the first warp's lanes), one axis each (the serial form on one thread was a chain of
// about fifteen integer divisions that every other warp waited for); published by the caller's
// next barrier among them. Needs the launcher's shapes.
__device__ __forceinline__ void block_tiles_parallel(const NeighborhoodGrid& g, int block,
                                                     bool transposed, BlockTiles* t,
                                                     int thread = static_cast<int>(threadIdx.x)) {
  const int r = thread;
  if (r < 3) {
    t->box_shape[r] = g.box_shape[r];
    t->seen_shape[r] = g.seen_shape[r];
    block_tiles_axis(g, r, block_index_on_axis(g, g.box_shape, block, r), transposed, *t);
  }
  __syncwarp();
  if (r == 0) t->num_seen_tiles = t->seen_tiles[0] * t->seen_tiles[1] * t->seen_tiles[2];
}
#endif

// Group-major coordinates of entry `index` of a box of `shape` at `origin` (axis 2 innermost), and
// its token; -1 when it lies past the box (a box smaller than the tile), past the grid's extent or
// on a hole.
__host__ __device__ __forceinline__ int box_token(const NeighborhoodGrid& g, const int (&shape)[3],
                                                  const int (&origin)[3], int index, int (&yp)[3]) {
  const int shift2 = log2_pow2(shape[2]), shift1 = log2_pow2(shape[1]);
  yp[2] = origin[2] + (index & (shape[2] - 1));
  yp[1] = origin[1] + ((index >> shift2) & (shape[1] - 1));
  yp[0] = origin[0] + (index >> (shift2 + shift1));
  int token = 0;
  bool inside = index < shape[0] * shape[1] * shape[2];
  for (int r = 0; r < 3; ++r) {
    const int y = grid_coordinate(g, r, yp[r]);
    inside = inside && y >= 0;
    token = token * g.size[r] + (y >= 0 ? y : 0);
  }
  return inside ? token : -1;
}

// u / n and u % n for 0 <= u < 2^20 and 1 <= n: on the device a float quotient corrected by one
// step (__fdividef errs by at most 2 ulp, under one unit below 2^20) instead of an integer
// division, which costs a dependent chain of about twenty instructions. Box indices run through
// this once per tile between two barriers, on every thread.
__host__ __device__ __forceinline__ int div_small(int u, int n, int* remainder) {
#ifdef __CUDA_ARCH__
  int q = __float2int_rz(__fdividef(__int2float_rn(u), __int2float_rn(n)));
  int r = u - q * n;
  if (r < 0) {
    --q;
    r += n;
  } else if (r >= n) {
    ++q;
    r -= n;
  }
  *remainder = r;
  return q;
#else
  *remainder = u % n;
  return u / n;
#endif
}

// Entry `index` of a block's own box: its token (box_token) and its group-major window per axis
// (transposed: the queries that see it); an empty window (lo > hi) where it has no token.
__host__ __device__ __forceinline__ int own_box_entry(const NeighborhoodGrid& g,
                                                      const BlockTiles& t, int index,
                                                      bool transposed, AxisWindow (&window)[3]) {
  int yp[3];
  const int token = box_token(g, t.box_shape, t.box_origin, index, yp);
  for (int a = 0; a < 3; ++a) {
    window[a] = token >= 0 ? group_major_window(g, a, yp[a], transposed) : AxisWindow{1, 0};
  }
  return token;
}

// Origin of key box u of a block.
__host__ __device__ __forceinline__ void seen_box_origin(const BlockTiles& t, int u,
                                                         int (&origin)[3]) {
  for (int r = 2; r >= 0; --r) {
    int index = 0;  // u % 1
    if (t.seen_tiles[r] != 1) u = div_small(u, t.seen_tiles[r], &index);
    origin[r] = t.seen_origin[r] + index * t.seen_shape[r];
  }
}

// Every query sees every key, between the block's box and seen box u: the seen box fills its tile
// of `tile` tokens and lies inside the block's full interval on every axis (full_interval: with
// dilation too, group-major boxes of one group hold neighbours). Tokens past an own box smaller
// than its tile, or on its holes, are computed but never stored. A few compares: no division
// besides the origin's.
__host__ __device__ __forceinline__ bool seen_box_is_full_at(const BlockTiles& t,
                                                             const int (&origin)[3], int tile) {
  bool full = t.seen_shape[0] * t.seen_shape[1] * t.seen_shape[2] == tile;
  for (int r = 0; r < 3; ++r) {
    full = full && origin[r] >= t.full_lo[r] && origin[r] + t.seen_shape[r] - 1 <= t.full_hi[r];
  }
  return full;
}
// The same for seen box u.
__host__ __device__ __forceinline__ bool seen_box_is_full(const NeighborhoodGrid&,
                                                          const BlockTiles& t, int u, int tile,
                                                          bool = false) {
  int origin[3];
  seen_box_origin(t, u, origin);
  return seen_box_is_full_at(t, origin, tile);
}

// The per-element test of the dK/dV kernel, in bytes: a box (at most 255 wide an axis) numbers its
// entries by their coordinates inside it, one byte an axis; a window clipped to the box is a byte
// range an axis. Entry r of a box of `shape`: bytes 0-2 its coordinates, byte 3 zero; past the
// box 0x00ffffff, which no range holds.
__host__ __device__ __forceinline__ unsigned box_local_bytes(const int (&shape)[3], int r) {
  if (r >= shape[0] * shape[1] * shape[2]) return 0x00ffffffu;
  return static_cast<unsigned>(r / (shape[1] * shape[2])) |
         static_cast<unsigned>(r / shape[2] % shape[1]) << 8 |
         static_cast<unsigned>(r % shape[2]) << 16;
}
// The group-major window `w` (per axis) clipped to the box at `origin` of `shape`, as byte ranges
// [lo, hi] (byte 3 of both zero); an axis the window misses gets lo 255, hi 0.
__host__ __device__ __forceinline__ void box_bounds_bytes(const AxisWindow (&w)[3],
                                                          const int (&origin)[3],
                                                          const int (&shape)[3], unsigned* lo,
                                                          unsigned* hi) {
  *lo = 0;
  *hi = 0;
  for (int a = 0; a < 3; ++a) {
    int l = max_int(w[a].lo - origin[a], 0);
    int h = min_int(w[a].hi - origin[a], shape[a] - 1);
    if (l > h) l = 255, h = 0;
    *lo |= static_cast<unsigned>(l) << (8 * a);
    *hi |= static_cast<unsigned>(h) << (8 * a);
  }
}
// Every byte of x lies in [lo, hi] byte-wise.
__host__ __device__ __forceinline__ bool bytes_within(unsigned x, unsigned lo, unsigned hi) {
#ifdef __CUDA_ARCH__
  return (__vcmpgeu4(x, lo) & __vcmpleu4(x, hi)) == 0xffffffffu;
#else
  bool within = true;
  for (int b = 0; b < 4; ++b) {
    const unsigned xb = (x >> (8 * b)) & 255u, lb = (lo >> (8 * b)) & 255u;
    within = within && xb >= lb && xb <= ((hi >> (8 * b)) & 255u);
  }
  return within;
#endif
}

// ---- The per-element test as bit masks (sm90) ---------------------------------------------------
// The sm90 kernels hold a score tile in the m16n8 fragment layout: the lanes of quad q (lane % 4)
// hold columns 2q + c + 8t (c < 2, t < tiles) of their rows; bit 2t + c of a 32-bit mask stands for
// column 2q + c + 8t. Column j of a box of power-of-two `shape` lies at x2 = j % s2,
// x1 = j / s2 % s1, x0 = j / (s1 s2) (past the box when x0 >= s0). Per quad, axis a and v in
// [0, s_a], a prefix entry holds the bits of the columns with x_a < v, so the columns with x_a in
// [l, h] are prefix(h + 1) & ~prefix(l), and a row's window clipped to a box is three such ranges
// ANDed: six table reads a row and tile instead of a byte test per score.

// Entries of one quad's table: s0 + s1 + s2 + 3, axis a's at prefix_base(shape, a).
__host__ __device__ __forceinline__ int prefix_base(const int (&shape)[3], int axis) {
  return (axis >= 1 ? shape[0] + 1 : 0) + (axis >= 2 ? shape[1] + 1 : 0);
}
__host__ __device__ __forceinline__ int prefix_entries(const int (&shape)[3]) {
  return prefix_base(shape, 2) + shape[2] + 1;
}

// The four quads' tables for `tiles` n8 tiles (at most 16: 32 bits), entries 0 ..
// prefix_entries(shape) - 1 of table[quad]. One pass over the columns puts each column's bit at
// entry x_a + 1 of every axis (axis 0: only columns inside the box), then a running OR along each
// axis makes entry v the columns with x_a < v. The launcher runs this per launch: set_box_shapes
// took 8.0 us while each entry looped over its quad's columns on its own, 0.5 us with this (NA
// 2-D 64x64 K 13, 128-key tiles, seen boxes 4 x 32; one AMD EPYC core).
inline void column_prefix_tables(const int (&shape)[3], int tiles,
                                 unsigned (&table)[4][NeighborhoodGrid::kMaxColumnEntries]) {
  const int entries = prefix_entries(shape);
  for (int quad = 0; quad < 4; ++quad) {
    for (int e = 0; e < entries; ++e) table[quad][e] = 0;
  }
  const int shift2 = log2_pow2(shape[2]), shift1 = log2_pow2(shape[1]);
  for (int j = 0; j < 8 * tiles; ++j) {
    unsigned* const bits = table[(j & 7) >> 1];  // column j sits in quad (j % 8) / 2
    const unsigned bit = 1u << (2 * (j >> 3) + (j & 1));
    const int x0 = j >> (shift2 + shift1);
    if (x0 < shape[0]) bits[prefix_base(shape, 0) + x0 + 1] |= bit;
    bits[prefix_base(shape, 1) + ((j >> shift2) & (shape[1] - 1)) + 1] |= bit;
    bits[prefix_base(shape, 2) + (j & (shape[2] - 1)) + 1] |= bit;
  }
  for (int quad = 0; quad < 4; ++quad) {
    for (int a = 0; a < 3; ++a) {
      unsigned* const prefix = table[quad] + prefix_base(shape, a);
      for (int v = 1; v <= shape[a]; ++v) prefix[v] |= prefix[v - 1];
    }
  }
}

// The columns of a quad (its table `prefix`) that a row with group-major `window` sees in the box
// at `origin` of `shape`.
__host__ __device__ __forceinline__ unsigned visible_columns(const unsigned* prefix,
                                                             const int (&shape)[3],
                                                             const int (&origin)[3],
                                                             const AxisWindow (&window)[3]) {
  unsigned bits = ~0u;
  int base = 0;
  for (int a = 0; a < 3; ++a) {
    int l = max_int(window[a].lo - origin[a], 0);
    int h = min_int(window[a].hi - origin[a], shape[a] - 1);
    if (l > h) l = 0, h = -1;  // prefix(0) & ~prefix(0): none
    bits &= prefix[base + h + 1] & ~prefix[base + l];
    base += shape[a] + 1;
  }
  return bits;
}

// For a launcher (sm90: through set_token_tiles, which takes rows and keys from the kernel's
// bookkeeping type): the shapes block_tiles(g, block, rows, keys, ...) would search, stored in g,
// so that every block of the launch reads them instead of searching on one thread (Nsight Compute,
// NA 2-D 64x64 K 13 forward at D 64: warps waiting at the barrier after thread 0's block_tiles
// were 21% of the kernel's stall samples), and the bit-mask test's tables for `keys` columns.
inline void set_box_shapes(NeighborhoodGrid& g, int rows, int keys) {
  block_box_shape(g, rows, g.box_shape);  // both read the grid's sizes and kernels only
  seen_box_shape(g, g.box_shape, keys, g.seen_shape);
  const int tiles = keys / 8;
  if (keys % 8 != 0 || tiles > 16 ||
      prefix_entries(g.seen_shape) > NeighborhoodGrid::kMaxColumnEntries) {
    g.column_tiles = 0;
    return;
  }
  g.column_tiles = tiles;
  column_prefix_tables(g.seen_shape, tiles, g.column_bits);
}

}  // namespace neighborhood

// Both directions tile the grid in boxes (kTokenTiles: the block_tiles() geometry above). The
// flattened-order members below serve the dQ kernel at bucket 256 and the host tests.
struct MaskNeighborhood {
  static constexpr bool kTokenTiles = true;
  const NeighborhoodGrid* grid;  // points into the kernel's __grid_constant__ parameters
  std::int64_t num_tokens;       // queries = keys = product of the grid

  __device__ static MaskNeighborhood make(const ForwardParams& p, std::int64_t,
                                          std::int64_t num_keys) {
    return {&p.neighborhood, num_keys};
  }

  __host__ __device__ neighborhood::RowWindow row_window(std::int64_t i) const {
    return i < num_tokens ? neighborhood::row_window(*grid, static_cast<int>(i))
                          : neighborhood::empty_window();
  }

  // Per axis, the rows' coordinates span [xmin, xmax]: exactly [x(first), x(last)] when all rows
  // share their coordinates on the outer axes (the coordinate then grows with the token index),
  // else the whole axis. The window's lowest key is at least d * start(pmin) with start evaluated
  // at the shortest group (n = floor(X / d)) and its highest at most (d - 1) + d * (start(pmax) +
  // K - 1) at the longest group (n = ceil(X / d)), because start only grows with p and with n. A
  // key inside every axis's bounds lies between the flattened bounds.
  __host__ __device__ KeyRange key_range(std::int64_t first_row, std::int64_t last_row) const {
    const NeighborhoodGrid& g = *grid;
    const int first = static_cast<int>(first_row), last = static_cast<int>(last_row);
    int span = static_cast<int>(num_tokens);  // tokens per coordinate tuple of the outer axes
    int begin = 0, end = 1;
    for (int r = 0; r < 3; ++r) {
      const int size = g.size[r], inner = span / size;
      const bool same_outer = first / span == last / span;
      const int xmin = same_outer ? first / inner % size : 0;
      const int xmax = same_outer ? last / inner % size : size - 1;
      const int d = g.dilation[r], k = g.kernel[r];
      int kmin, kmax;
      if (g.causal[r]) {
        kmin = d * neighborhood::max_int(xmin / d - k + 1, 0);
        kmax = xmax;
      } else {
        const int shortest = size / d, longest = (size + d - 1) / d;
        kmin = d * neighborhood::min_int(neighborhood::max_int(xmin / d - k / 2, 0), shortest - k);
        kmax = d - 1 +
               d * (neighborhood::min_int(neighborhood::max_int(xmax / d - k / 2, 0), longest - k) +
                    k - 1);
        kmax = neighborhood::min_int(kmax, size - 1);
      }
      begin += kmin * inner;
      end += kmax * inner;
      span = inner;
    }
    return {begin, end};
  }

  __host__ __device__ bool visible(std::int64_t i, std::int64_t j) const {
    if (j >= num_tokens) return false;
    return neighborhood::window_sees(*grid, row_window(i),
                                     neighborhood::coords_of(*grid, static_cast<int>(j)));
  }
};

}  // namespace fmha::cuda
