// Visibility masks of SPEC §3 and §6 as explicit [Lq, Lk] matrices (1 = visible), written from the
// formulas, one query/key pair at a time.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace naive {

// Causal (either alignment) and sliding window; left/right -1 = unbounded.
std::vector<char> attention_mask(std::int64_t lq, std::int64_t lk, bool causal, bool bottom_right,
                                 std::int64_t window_left, std::int64_t window_right);

struct NeighborhoodGeometry {
  int rank = 1;
  std::array<std::int64_t, 3> grid{1, 1, 1};
  std::array<std::int64_t, 3> kernel{1, 1, 1};
  std::array<std::int64_t, 3> dilation{1, 1, 1};
  std::array<bool, 3> causal{false, false, false};
};

// [N, N] over the row-major flattened grid, N = product of the grid.
std::vector<char> neighborhood_mask(const NeighborhoodGeometry& g);

}  // namespace naive
