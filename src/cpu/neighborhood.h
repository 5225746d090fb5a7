// Neighborhood attention (SPEC §6) on the fast CPU kernels: the grid's geometry, computed once per
// call, and the tiles of one task as a mask policy (tiles.h).
//
// Tasks work on boxes of the grid in group-major coordinates: on an axis with dilation d and
// P = ceil(X / d) positions per group, coordinate y = g + d * p (group g, position p) maps to
// y' = g * P + p. A query's window is then one interval of y' per axis, keys of other groups fall
// outside it, and the keys some query of a box sees form a box too (the per-axis union of the
// windows): the task gathers that region's tokens row-major into tiles, so it never visits a key
// tile no query of its box sees. y' whose position lies past its group's length are holes (no
// token) and are skipped. The dK / dV pass reads the geometry transposed: its own box holds keys,
// the region the queries that see them.
//
// A row's mask compares each gathered key's y' with the row's window, axis by axis: unsigned
// differences, so one compare a bound pair, over int32 coordinates in vectors (the kernels inline
// it). Walking runs of consecutive keys instead (a few fills a run) took a quarter of the forward's
// time on a 32 x 32 grid with a 7 x 7 kernel (AMD EPYC, one thread): the branches and short fills
// cost more than the compares.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/tiles.h"
#include "fmha/params.h"

namespace fmha::cpu {

// An interval [lo, hi] of group-major coordinates on one axis (empty when hi < lo).
struct AxisRange {
  std::int64_t lo = 0, hi = -1;
};

// A grid over up to three axes (axes past the rank have size 1, kernel 1, dilation 1).
struct NeighborhoodGeometry {
  std::int64_t size[3] = {1, 1, 1};
  std::int64_t extent[3] = {1, 1, 1};  // dilation x positions per group: the group-major range
  // Per axis, indexed by grid coordinate y: its group-major y'; the keys a query at y sees; the
  // queries that see a key at y.
  std::vector<std::int64_t> group_major[3];
  std::vector<AxisRange> window[3], seen_by[3];
  // Per axis, indexed by y': the grid coordinate, or -1 for a hole.
  std::vector<std::int64_t> coordinate[3];
  // Box shapes: a query box holds up to kQueryTile tokens, a key box up to kKeyTile.
  std::int64_t query_box[3] = {1, 1, 1}, key_box[3] = {1, 1, 1};
  // Visible keys per query away from the borders: the product of the kernel sizes.
  std::int64_t keys_per_query = 1;

  static NeighborhoodGeometry of(const NeighborhoodOptions& o, int rank,
                                 const std::array<std::int64_t, 3>& grid);
  // Boxes of `shape` that cover the group-major extent.
  std::int64_t boxes(const std::int64_t (&shape)[3]) const;
};

// One task's tiles: its own box of queries (for_queries) or keys (for_keys) and the tiles of the
// region it sees, gathered into `scratch`, which the object reads until the next build.
struct NeighborhoodScratch {
  struct Window {  // a query's visible group-major ranges
    std::int64_t lo[3], hi[3];
  };
  std::vector<std::int64_t> q_tokens, k_tokens;
  std::vector<Window> windows;       // per gathered query
  std::vector<Window> query_common;  // per query tile: what every query of it sees
  std::vector<Window> key_bounds;    // per key tile: the box that holds its keys
  std::vector<std::int32_t> key_y[3];  // per gathered key: its y' on each axis
  std::vector<std::int64_t> coords;    // gathering: group-major coordinates, 3 a token
};

class NeighborhoodTiles {
 public:
  static constexpr bool kExtraKeys = false;
  // Query box `box` and the key tiles of kKeyTile its queries see.
  static NeighborhoodTiles for_queries(const NeighborhoodGeometry& g, std::int64_t box,
                                       NeighborhoodScratch& s);
  // Key box `box` and the query tiles of `query_tile` rows that see its keys.
  static NeighborhoodTiles for_keys(const NeighborhoodGeometry& g, std::int64_t box,
                                    std::int64_t query_tile, NeighborhoodScratch& s);

  std::int64_t count() const { return count_; }
  Tile queries(std::int64_t t) const {
    return fixed_is_queries_ ? gathered(s_->q_tokens, 0, s_->q_tokens.size())
                             : gathered(s_->q_tokens, t * step_, step_);
  }
  Tile keys(std::int64_t t) const {
    return fixed_is_queries_ ? gathered(s_->k_tokens, t * step_, step_)
                             : gathered(s_->k_tokens, 0, s_->k_tokens.size());
  }
  bool full(std::int64_t t) const;
  // Row r of pair t: the scores of keys outside the query's window set to -inf.
  FMHA_CPU_INLINE void hide(std::int64_t t, std::int64_t r, float* row) const {
    const NeighborhoodScratch::Window& w =
        s_->windows[static_cast<std::size_t>(query_tile(t) * (fixed_is_queries_ ? 0 : step_) + r)];
    const std::int64_t first = key_tile(t) * (fixed_is_queries_ ? step_ : 0);
    const std::int64_t cols = keys(t).count;
    const std::int32_t* y0 = s_->key_y[0].data() + first;
    const std::int32_t* y1 = s_->key_y[1].data() + first;
    const std::int32_t* y2 = s_->key_y[2].data() + first;
    const auto lo0 = static_cast<std::int32_t>(w.lo[0]), lo1 = static_cast<std::int32_t>(w.lo[1]),
               lo2 = static_cast<std::int32_t>(w.lo[2]);
    const auto span0 = static_cast<std::uint32_t>(w.hi[0] - w.lo[0]),
               span1 = static_cast<std::uint32_t>(w.hi[1] - w.lo[1]),
               span2 = static_cast<std::uint32_t>(w.hi[2] - w.lo[2]);
    for (std::int64_t j = 0; j < cols; ++j) {
      const bool seen = (static_cast<std::uint32_t>(y0[j] - lo0) <= span0) &
                        (static_cast<std::uint32_t>(y1[j] - lo1) <= span1) &
                        (static_cast<std::uint32_t>(y2[j] - lo2) <= span2);
      row[j] = seen ? row[j] : -std::numeric_limits<float>::infinity();
    }
  }
  // Bias and rel-pos do not take this path (backend.cpp): nothing to add.
  void add_terms(const Call&, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                 float*) const {}

 private:
  Tile gathered(const std::vector<std::int64_t>& tokens, std::int64_t first,
                std::int64_t most) const {
    const auto size = static_cast<std::int64_t>(tokens.size());
    return {.first = 0, .count = std::min(most, size - first), .gathered = tokens.data() + first};
  }
  static NeighborhoodTiles build(const NeighborhoodGeometry& g, std::int64_t box,
                                 bool queries_fixed, std::int64_t query_tile,
                                 NeighborhoodScratch& s);
  // The tile pair t's query tile and key tile indices.
  std::int64_t query_tile(std::int64_t t) const { return fixed_is_queries_ ? 0 : t; }
  std::int64_t key_tile(std::int64_t t) const { return fixed_is_queries_ ? t : 0; }

  const NeighborhoodScratch* s_ = nullptr;
  bool fixed_is_queries_ = true;
  std::int64_t step_ = 0, count_ = 0;
};

}  // namespace fmha::cpu
