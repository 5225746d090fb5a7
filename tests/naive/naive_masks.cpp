#include "naive/naive_masks.h"

#include <algorithm>

namespace naive {

std::vector<char> attention_mask(std::int64_t lq, std::int64_t lk, bool causal, bool bottom_right,
                                 std::int64_t window_left, std::int64_t window_right) {
  std::vector<char> mask(static_cast<std::size_t>(lq * lk), 1);
  for (std::int64_t i = 0; i < lq; ++i) {
    const std::int64_t diagonal = bottom_right ? i + lk - lq : i;
    for (std::int64_t j = 0; j < lk; ++j) {
      bool visible = true;
      if (causal && j > diagonal) visible = false;
      if (window_left >= 0 && j < diagonal - window_left) visible = false;
      if (window_right >= 0 && j > diagonal + window_right) visible = false;
      mask[static_cast<std::size_t>(i * lk + j)] = visible;
    }
  }
  return mask;
}

namespace {

// SPEC §6 on one axis: is key coordinate y visible to query coordinate x?
bool axis_visible(std::int64_t x, std::int64_t y, std::int64_t length, std::int64_t kernel,
                  std::int64_t dilation, bool causal) {
  const std::int64_t group = x % dilation;
  if (y % dilation != group) return false;
  const std::int64_t p = x / dilation;
  const std::int64_t t = y / dilation;
  const std::int64_t n = (length - group + dilation - 1) / dilation;
  if (causal) return std::max<std::int64_t>(p - kernel + 1, 0) <= t && t <= p;
  const std::int64_t start = std::clamp<std::int64_t>(p - kernel / 2, 0, n - kernel);
  return start <= t && t < start + kernel;
}

}  // namespace

std::vector<char> neighborhood_mask(const NeighborhoodGeometry& g) {
  std::int64_t n = 1;
  for (int r = 0; r < g.rank; ++r) n *= g.grid[r];
  // Coordinates of a flattened token, row-major over the grid.
  auto coords = [&](std::int64_t token) {
    std::array<std::int64_t, 3> c{0, 0, 0};
    for (int r = g.rank - 1; r >= 0; --r) {
      c[r] = token % g.grid[r];
      token /= g.grid[r];
    }
    return c;
  };
  std::vector<char> mask(static_cast<std::size_t>(n * n), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto ci = coords(i);
    for (std::int64_t j = 0; j < n; ++j) {
      const auto cj = coords(j);
      bool visible = true;
      for (int r = 0; r < g.rank; ++r)
        visible = visible && axis_visible(ci[r], cj[r], g.grid[r], g.kernel[r], g.dilation[r], g.causal[r]);
      mask[static_cast<std::size_t>(i * n + j)] = visible;
    }
  }
  return mask;
}

}  // namespace naive
