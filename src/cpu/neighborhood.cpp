// The neighborhood geometry of the fast CPU kernels (neighborhood.h).
#include "cpu/neighborhood.h"

#include <algorithm>
#include <limits>

namespace fmha::cpu {
namespace {

std::int64_t pow2_ceil(std::int64_t x) {
  std::int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

// A box of up to `tokens` tokens: powers of two per axis, grown in turn from the innermost axis
// while an axis has room, so that a box stays about square (a square of side s of a 2-D grid sees
// (s + K - 1)^2 keys, a row of s^2 tokens K (s^2 + K - 1)).
void box_shape(const std::int64_t (&extent)[3], std::int64_t tokens, std::int64_t (&shape)[3]) {
  std::int64_t product = 1;
  for (std::int64_t& s : shape) s = 1;
  for (bool grew = true; grew && product < tokens;) {
    grew = false;
    for (int r = 2; r >= 0; --r) {
      if (product < tokens && 2 * shape[r] <= pow2_ceil(extent[r])) {
        shape[r] *= 2;
        product *= 2;
        grew = true;
      }
    }
  }
}

// One axis of length x, kernel k, dilation d (SPEC §6): the tables of NeighborhoodGeometry.
void build_axis(std::int64_t x, std::int64_t k, std::int64_t d, bool causal,
                NeighborhoodGeometry& g, int r) {
  const std::int64_t positions = (x + d - 1) / d;
  g.size[r] = x;
  g.extent[r] = d * positions;
  g.group_major[r].resize(static_cast<std::size_t>(x));
  g.window[r].resize(static_cast<std::size_t>(x));
  g.seen_by[r].resize(static_cast<std::size_t>(x));
  g.coordinate[r].assign(static_cast<std::size_t>(g.extent[r]), -1);
  std::vector<std::int64_t> first(static_cast<std::size_t>(positions));
  for (std::int64_t group = 0; group < d && group < x; ++group) {
    const std::int64_t n = (x - group + d - 1) / d;  // >= k, since K * d <= X is validated
    const std::int64_t base = group * positions;
    for (std::int64_t p = 0; p < n; ++p) {
      const auto y = static_cast<std::size_t>(group + d * p);
      first[static_cast<std::size_t>(p)] =
          causal ? std::max<std::int64_t>(p - k + 1, 0) : std::clamp<std::int64_t>(p - k / 2, 0, n - k);
      const std::int64_t last = causal ? p : first[static_cast<std::size_t>(p)] + k - 1;
      g.group_major[r][y] = base + p;
      g.coordinate[r][static_cast<std::size_t>(base + p)] = static_cast<std::int64_t>(y);
      g.window[r][y] = {base + first[static_cast<std::size_t>(p)], base + last};
    }
    // Both ends of a window grow with the query's position, so the queries that see position t
    // are an interval: from the first whose window ends at or after t to the last whose window
    // starts at or before t.
    std::int64_t a = 0, b = 0;
    for (std::int64_t t = 0; t < n; ++t) {
      const auto last_of = [&](std::int64_t p) {
        return causal ? p : first[static_cast<std::size_t>(p)] + k - 1;
      };
      while (a < n && last_of(a) < t) ++a;
      while (b + 1 < n && first[static_cast<std::size_t>(b + 1)] <= t) ++b;
      g.seen_by[r][static_cast<std::size_t>(group + d * t)] = {base + a, base + b};
    }
  }
}

// The box of `shape` with index `box` (row-major over the boxes covering the extent): its origin.
void box_origin(const NeighborhoodGeometry& g, const std::int64_t (&shape)[3], std::int64_t box,
                std::int64_t (&origin)[3]) {
  for (int r = 2; r >= 0; --r) {
    const std::int64_t boxes = (g.extent[r] + shape[r] - 1) / shape[r];
    origin[r] = box % boxes * shape[r];
    box /= boxes;
  }
}

// Appends the tokens of the group-major box [lo, hi] (inclusive) in row-major order, holes
// skipped, and their group-major coordinates.
void gather(const NeighborhoodGeometry& g, const std::int64_t (&lo)[3],
            const std::int64_t (&hi)[3], std::vector<std::int64_t>& tokens,
            std::vector<std::int64_t>& coords) {
  tokens.clear();
  coords.clear();
  for (std::int64_t a = lo[0]; a <= hi[0]; ++a) {
    const std::int64_t y0 = g.coordinate[0][static_cast<std::size_t>(a)];
    if (y0 < 0) continue;
    for (std::int64_t b = lo[1]; b <= hi[1]; ++b) {
      const std::int64_t y1 = g.coordinate[1][static_cast<std::size_t>(b)];
      if (y1 < 0) continue;
      const std::int64_t row = (y0 * g.size[1] + y1) * g.size[2];
      for (std::int64_t c = lo[2]; c <= hi[2]; ++c) {
        const std::int64_t y2 = g.coordinate[2][static_cast<std::size_t>(c)];
        if (y2 < 0) continue;
        tokens.push_back(row + y2);
        coords.insert(coords.end(), {a, b, c});
      }
    }
  }
}

// The box `box` of `shape` as inclusive group-major bounds (clipped to the extent), and the region
// its tokens reach through `reach` (window: the keys its queries see; seen_by: the queries that see
// its keys), the per-axis union over its coordinates.
void box_and_region(const NeighborhoodGeometry& g, const std::int64_t (&shape)[3],
                    std::int64_t box, const std::vector<AxisRange> (&reach)[3],
                    std::int64_t (&lo)[3], std::int64_t (&hi)[3], std::int64_t (&region_lo)[3],
                    std::int64_t (&region_hi)[3]) {
  std::int64_t origin[3];
  box_origin(g, shape, box, origin);
  for (int r = 0; r < 3; ++r) {
    lo[r] = origin[r];
    hi[r] = std::min(origin[r] + shape[r], g.extent[r]) - 1;
    region_lo[r] = std::numeric_limits<std::int64_t>::max();
    region_hi[r] = -1;
    for (std::int64_t yp = lo[r]; yp <= hi[r]; ++yp) {
      const std::int64_t y = g.coordinate[r][static_cast<std::size_t>(yp)];
      if (y < 0) continue;
      const AxisRange& range = reach[r][static_cast<std::size_t>(y)];
      region_lo[r] = std::min(region_lo[r], range.lo);
      region_hi[r] = std::max(region_hi[r], range.hi);
    }
  }
}

// The windows of the gathered queries, and per tile of `step` queries what all of them see.
void query_windows(const NeighborhoodGeometry& g, std::int64_t step, NeighborhoodScratch& s) {
  const std::size_t count = s.q_tokens.size();
  s.windows.resize(count);
  s.query_common.clear();
  for (std::size_t i = 0; i < count; ++i) {
    NeighborhoodScratch::Window& w = s.windows[i];
    if (i % static_cast<std::size_t>(step) == 0) {
      s.query_common.push_back({{0, 0, 0}, {0, 0, 0}});
      for (int r = 0; r < 3; ++r) {
        s.query_common.back().lo[r] = std::numeric_limits<std::int64_t>::min();
        s.query_common.back().hi[r] = std::numeric_limits<std::int64_t>::max();
      }
    }
    NeighborhoodScratch::Window& common = s.query_common.back();
    for (int r = 0; r < 3; ++r) {
      const std::int64_t y = g.coordinate[r][static_cast<std::size_t>(s.coords[3 * i + r])];
      const AxisRange& range = g.window[r][static_cast<std::size_t>(y)];
      w.lo[r] = range.lo;
      w.hi[r] = range.hi;
      common.lo[r] = std::max(common.lo[r], range.lo);
      common.hi[r] = std::min(common.hi[r], range.hi);
    }
  }
}

// The gathered keys' coordinates, and the bounding box of each tile of `step` keys.
void key_coordinates(std::int64_t step, NeighborhoodScratch& s) {
  const auto count = static_cast<std::int64_t>(s.k_tokens.size());
  s.key_bounds.clear();
  for (int r = 0; r < 3; ++r) s.key_y[r].resize(static_cast<std::size_t>(count));
  for (std::int64_t j = 0; j < count; ++j) {
    const std::int64_t* y = &s.coords[static_cast<std::size_t>(3 * j)];
    if (j % step == 0) s.key_bounds.push_back({{y[0], y[1], y[2]}, {y[0], y[1], y[2]}});
    NeighborhoodScratch::Window& bounds = s.key_bounds.back();
    for (int r = 0; r < 3; ++r) {
      bounds.lo[r] = std::min(bounds.lo[r], y[r]);
      bounds.hi[r] = std::max(bounds.hi[r], y[r]);
      s.key_y[r][static_cast<std::size_t>(j)] = static_cast<std::int32_t>(y[r]);
    }
  }
}

}  // namespace

NeighborhoodGeometry NeighborhoodGeometry::of(const NeighborhoodOptions& o, int rank,
                                              const std::array<std::int64_t, 3>& grid) {
  NeighborhoodGeometry g;
  for (int r = 0; r < 3; ++r) {
    const auto u = static_cast<std::size_t>(r);
    const bool used = r < rank;
    build_axis(used ? grid[u] : 1, used ? o.kernel_size[u] : 1, used ? o.dilation[u] : 1,
               used && o.causal[u], g, r);
    if (used) g.keys_per_query *= o.kernel_size[u];
  }
  box_shape(g.extent, kQueryTile, g.query_box);
  box_shape(g.extent, kKeyTile, g.key_box);
  return g;
}

std::int64_t NeighborhoodGeometry::boxes(const std::int64_t (&shape)[3]) const {
  std::int64_t n = 1;
  for (int r = 0; r < 3; ++r) n *= (extent[r] + shape[r] - 1) / shape[r];
  return n;
}

NeighborhoodTiles NeighborhoodTiles::for_queries(const NeighborhoodGeometry& g, std::int64_t box,
                                                 NeighborhoodScratch& s) {
  return build(g, box, true, kQueryTile, s);
}

NeighborhoodTiles NeighborhoodTiles::for_keys(const NeighborhoodGeometry& g, std::int64_t box,
                                              std::int64_t query_tile, NeighborhoodScratch& s) {
  return build(g, box, false, query_tile, s);
}

NeighborhoodTiles NeighborhoodTiles::build(const NeighborhoodGeometry& g, std::int64_t box,
                                           bool queries_fixed, std::int64_t query_tile,
                                           NeighborhoodScratch& s) {
  std::int64_t lo[3], hi[3], region_lo[3], region_hi[3];
  box_and_region(g, queries_fixed ? g.query_box : g.key_box, box,
                 queries_fixed ? g.window : g.seen_by, lo, hi, region_lo, region_hi);
  // Gathering overwrites s.coords: each side's tables are built right after its gathering.
  const auto gather_queries = [&](const std::int64_t(&from)[3], const std::int64_t(&to)[3]) {
    gather(g, from, to, s.q_tokens, s.coords);
    query_windows(g, query_tile, s);
  };
  const auto gather_keys = [&](const std::int64_t(&from)[3], const std::int64_t(&to)[3]) {
    gather(g, from, to, s.k_tokens, s.coords);
    key_coordinates(kKeyTile, s);
  };
  if (queries_fixed) {
    gather_queries(lo, hi);
    gather_keys(region_lo, region_hi);
  } else {
    gather_keys(lo, hi);
    gather_queries(region_lo, region_hi);
  }
  NeighborhoodTiles t;
  t.s_ = &s;
  t.fixed_is_queries_ = queries_fixed;
  t.step_ = queries_fixed ? kKeyTile : query_tile;
  const bool empty = queries_fixed ? s.q_tokens.empty() : s.k_tokens.empty();
  const std::size_t others = queries_fixed ? s.key_bounds.size() : s.query_common.size();
  t.count_ = empty ? 0 : static_cast<std::int64_t>(others);
  return t;
}

bool NeighborhoodTiles::full(std::int64_t t) const {
  const NeighborhoodScratch::Window& q = s_->query_common[static_cast<std::size_t>(query_tile(t))];
  const NeighborhoodScratch::Window& k = s_->key_bounds[static_cast<std::size_t>(key_tile(t))];
  for (int r = 0; r < 3; ++r) {
    if (k.lo[r] < q.lo[r] || k.hi[r] > q.hi[r]) return false;
  }
  return true;
}

}  // namespace fmha::cpu
