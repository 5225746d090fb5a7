#include "reference/visibility.h"

#include <algorithm>

namespace fmha::reference {

Visibility Visibility::band(std::int64_t len_q, std::int64_t len_k, bool causal,
                            CausalAlignment alignment, std::int64_t window_left,
                            std::int64_t window_right) {
  Visibility v;
  v.kind_ = Kind::kBand;
  v.len_k_ = len_k;
  // The aligned diagonal d(i) = i + diagonal; causal is the window (-1, 0) and both may be given,
  // so the upper bound is the tighter of the two.
  const std::int64_t diagonal = alignment == CausalAlignment::kBottomRight ? len_k - len_q : 0;
  if (window_left >= 0) {
    v.has_lower_ = true;
    v.lower_ = diagonal - window_left;
  }
  if (causal) {
    v.has_upper_ = true;
    v.upper_ = diagonal;
  }
  if (window_right >= 0) {
    v.upper_ = v.has_upper_ ? std::min(v.upper_, diagonal + window_right) : diagonal + window_right;
    v.has_upper_ = true;
  }
  return v;
}

Visibility Visibility::neighborhood(const NeighborhoodOptions& options, int grid_rank,
                                    const std::array<std::int64_t, 3>& grid) {
  Visibility v;
  v.kind_ = Kind::kNeighborhood;
  v.grid_rank_ = grid_rank;
  v.options_ = options;
  v.len_k_ = 1;
  for (int r = 0; r < grid_rank; ++r) {
    v.grid_[static_cast<std::size_t>(r)] = grid[static_cast<std::size_t>(r)];
    v.len_k_ *= grid[static_cast<std::size_t>(r)];
  }
  return v;
}

void Visibility::visible_keys(std::int64_t query, std::vector<std::int64_t>* keys) const {
  keys->clear();
  if (kind_ == Kind::kBand) {
    band_keys(query, keys);
  } else {
    neighborhood_keys(query, keys);
  }
}

void Visibility::band_keys(std::int64_t query, std::vector<std::int64_t>* keys) const {
  const std::int64_t first = has_lower_ ? std::max<std::int64_t>(query + lower_, 0) : 0;
  const std::int64_t last = has_upper_ ? std::min(query + upper_, len_k_ - 1) : len_k_ - 1;
  for (std::int64_t j = first; j <= last; ++j) keys->push_back(j);
}

namespace {

// The key coordinates visible on one axis of length `length` from query coordinate `x` (SPEC §6).
// Dilation splits the axis into `dilation` interleaved groups; the window lives inside x's group.
std::vector<std::int64_t> axis_neighbors(std::int64_t x, std::int64_t length, std::int64_t kernel,
                                         std::int64_t dilation, bool causal) {
  const std::int64_t group = x % dilation;
  const std::int64_t position = x / dilation;
  const std::int64_t group_length = (length - group + dilation - 1) / dilation;
  std::int64_t first, last;  // positions inside the group, inclusive
  if (causal) {
    first = std::max<std::int64_t>(position - kernel + 1, 0);
    last = position;
  } else {
    // Near a border the window keeps its K positions by shifting inward (kernel * dilation <=
    // length guarantees group_length >= kernel, so the clamp range is never empty).
    first = std::clamp<std::int64_t>(position - kernel / 2, 0, group_length - kernel);
    last = first + kernel - 1;
  }
  std::vector<std::int64_t> coords;
  for (std::int64_t t = first; t <= last; ++t) coords.push_back(group + dilation * t);
  return coords;
}

}  // namespace

void Visibility::neighborhood_keys(std::int64_t query, std::vector<std::int64_t>* keys) const {
  // Row-major coordinates of the query token, then the visible coordinates per axis.
  std::array<std::vector<std::int64_t>, 3> neighbors;
  std::int64_t rest = query;
  for (int r = grid_rank_ - 1; r >= 0; --r) {
    const auto axis = static_cast<std::size_t>(r);
    const std::int64_t x = rest % grid_[axis];
    rest /= grid_[axis];
    neighbors[axis] = axis_neighbors(x, grid_[axis], options_.kernel_size[axis],
                                     options_.dilation[axis], options_.causal[axis]);
  }
  for (int r = grid_rank_; r < 3; ++r) neighbors[static_cast<std::size_t>(r)] = {0};
  // A key is visible iff it is visible on every axis: the product of the per-axis sets, enumerated
  // row-major so the flat indices come out ascending.
  for (const std::int64_t c0 : neighbors[0]) {
    for (const std::int64_t c1 : neighbors[1]) {
      for (const std::int64_t c2 : neighbors[2])
        keys->push_back((c0 * grid_[1] + c1) * grid_[2] + c2);
    }
  }
}

}  // namespace fmha::reference
