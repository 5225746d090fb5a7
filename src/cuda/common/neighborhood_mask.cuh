// Neighborhood attention (SPEC §6) as a mask policy of the forward mainloop.
//
// This first NA kernel tiles flattened rows: a block takes block_m consecutive tokens of the
// row-major grid and walks one flattened key range that covers every key any of them sees (from
// per-axis bounds of the rows' coordinates). That is exact but, on 2-D and 3-D grids, visits many
// partially visible and even empty key tiles; multi-dimensional query tiles (issue 5) come next and
// reuse the per-axis geometry below.
//
// Grids have fewer than 2^31 tokens (the host refuses larger ones), so the per-element test is
// 32-bit integer arithmetic. Axes past the grid's rank have size 1, kernel 1 and dilation 1: every
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

// SPEC §6 read the other way, for the backward: the query coordinates on axis r whose window holds
// key coordinate y (same dilation group, positions first .. last). Both window bounds grow with the
// query position p, so these form an interval. Non-causal: the window ends at or after position t
// of y iff p >= t - K + 1 + K/2 (or always, when t < K, the window then starting at 0), and starts
// at or before t iff p <= t + K/2 (or always, when t >= n - K, the window never starting past
// n - K). Causal: max(p - K + 1, 0) <= t <= p iff t <= p <= t + K - 1.
__host__ __device__ __forceinline__ AxisWindow axis_window_transposed(const NeighborhoodGrid& g,
                                                                      int r, int y) {
  const int d = g.dilation[r], k = g.kernel[r];
  const int group = y % d, t = y / d;
  const int n = (g.size[r] - group + d - 1) / d;
  int first, last;
  if (g.causal[r]) {
    first = t;
    last = min_int(t + k - 1, n - 1);
  } else {
    first = t >= k ? t - k + 1 + k / 2 : 0;
    last = t >= n - k ? n - 1 : min_int(t + k / 2, n - 1);
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

// The queries that see one key, axis by axis (a RowWindow over query coordinates).
__host__ __device__ __forceinline__ RowWindow column_window(const NeighborhoodGrid& g, int key) {
  const Coords c = coords_of(g, key);
  RowWindow w;
  for (int r = 0; r < 3; ++r) w.axis[r] = axis_window_transposed(g, r, c.x[r]);
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

}  // namespace neighborhood

struct MaskNeighborhood {
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

  // The backward's transposed question: the queries that see a key of [first_key, last_key], as
  // one flattened range, from per-axis bounds like key_range()'s. The keys' coordinates span
  // [ymin, ymax] per axis; the lowest query coordinate seeing one of them is at least
  // d * first(ymin / d) (first does not depend on the group length and grows with t), the highest
  // at most (d - 1) + d * last(ymax / d) with last bounded over both group lengths.
  __host__ __device__ KeyRange query_range(std::int64_t first_key, std::int64_t last_key) const {
    const NeighborhoodGrid& g = *grid;
    const int first = static_cast<int>(first_key);
    const int last = static_cast<int>(last_key < num_tokens ? last_key : num_tokens - 1);
    if (first > last) return {0, 0};
    int span = static_cast<int>(num_tokens);
    int begin = 0, end = 1;
    for (int r = 0; r < 3; ++r) {
      const int size = g.size[r], inner = span / size;
      const bool same_outer = first / span == last / span;
      const int ymin = same_outer ? first / inner % size : 0;
      const int ymax = same_outer ? last / inner % size : size - 1;
      const int d = g.dilation[r], k = g.kernel[r];
      const int tmin = ymin / d, tmax = ymax / d;
      const int shortest = size / d, longest = (size + d - 1) / d;
      int pmin, pmax;
      if (g.causal[r]) {
        pmin = tmin;
        pmax = neighborhood::min_int(tmax + k - 1, longest - 1);
      } else {
        pmin = tmin >= k ? tmin - k + 1 + k / 2 : 0;
        pmax =
            tmax >= shortest - k ? longest - 1 : neighborhood::min_int(tmax + k / 2, longest - 1);
      }
      begin += d * pmin * inner;
      end += neighborhood::min_int(d - 1 + d * pmax, size - 1) * inner;
      span = inner;
    }
    return {begin, end};
  }

  // The queries that see key j, axis by axis; nothing for keys past the last token.
  __host__ __device__ neighborhood::RowWindow column_window(std::int64_t j) const {
    return j < num_tokens ? neighborhood::column_window(*grid, static_cast<int>(j))
                          : neighborhood::empty_window();
  }

  // Provably full only on a 1-D grid without dilation (axis 0 carries it): there both window
  // bounds grow with the query, so the rows see the whole tile iff the last row's window starts
  // at or before it and the first row's window ends at or after it. Elsewhere a tile of
  // consecutive tokens crosses grid rows or dilation groups; it is treated as partial.
  __host__ __device__ bool tile_is_full(std::int64_t first_row, std::int64_t last_row,
                                        std::int64_t first_key, int tile_keys) const {
    const NeighborhoodGrid& g = *grid;
    const std::int64_t last_key = first_key + tile_keys - 1;
    if (g.size[1] != 1 || g.size[2] != 1 || g.dilation[0] != 1 || last_key >= num_tokens) {
      return false;
    }
    const neighborhood::AxisWindow last_row_window =
        neighborhood::axis_window(g, 0, static_cast<int>(last_row));
    const neighborhood::AxisWindow first_row_window =
        neighborhood::axis_window(g, 0, static_cast<int>(first_row));
    return last_row_window.lo <= first_key && first_row_window.hi >= last_key;
  }

  __host__ __device__ bool visible(std::int64_t i, std::int64_t j) const {
    if (j >= num_tokens) return false;
    return neighborhood::window_sees(*grid, row_window(i),
                                     neighborhood::coords_of(*grid, static_cast<int>(j)));
  }
};

// hide_invisible (mask_policies.cuh) for neighborhood masks: each of this thread's two rows gets
// its window once instead of per element. The rows go one after the other, so that only one
// window is live next to the kernel's accumulators (both at once spilled in the 64 bucket, whose
// two row blocks a warp already hold ~250 registers).
template <int kTiles>
__device__ __forceinline__ void hide_invisible(const MaskNeighborhood& mask, float (&s)[kTiles][4],
                                               std::int64_t row, std::int64_t col) {
  // Keys of a tile reach at most a tile past the last token: int (see the host's token limit).
  const int tokens = static_cast<int>(mask.num_tokens), first_col = static_cast<int>(col);
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // entries 0, 1 on `row`; 2, 3 on row + 8
    const neighborhood::RowWindow window = mask.row_window(row + 8 * half);
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int j = first_col + t * 8 + c;
        if (j >= tokens || !neighborhood::window_sees(*mask.grid, window,
                                                      neighborhood::coords_of(*mask.grid, j))) {
          s[t][2 * half + c] = -INFINITY;
        }
      }
    }
  }
}

}  // namespace fmha::cuda
