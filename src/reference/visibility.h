// Which keys a query sees (SPEC §3, §6): the masks of one sequence, answered as the ascending list
// of visible key indices of a query. Extra keys are not masked and are not listed here.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "fmha/params.h"

namespace fmha::reference {

class Visibility {
 public:
  // Causal and/or sliding window over a 1-D sequence (SPEC §3); the result is one contiguous band.
  static Visibility band(std::int64_t len_q, std::int64_t len_k, bool causal,
                         CausalAlignment alignment, std::int64_t window_left,
                         std::int64_t window_right);
  // Neighborhood attention over a grid shared by queries and keys (SPEC §6).
  static Visibility neighborhood(const NeighborhoodOptions& options, int grid_rank,
                                 const std::array<std::int64_t, 3>& grid);

  // Replaces *keys with the visible key indices of `query`, ascending.
  void visible_keys(std::int64_t query, std::vector<std::int64_t>* keys) const;

 private:
  enum class Kind { kBand, kNeighborhood };

  void band_keys(std::int64_t query, std::vector<std::int64_t>* keys) const;
  void neighborhood_keys(std::int64_t query, std::vector<std::int64_t>* keys) const;

  Kind kind_ = Kind::kBand;
  std::int64_t len_k_ = 0;
  // Band: key j is visible to query i iff i + lower_ <= j <= i + upper_ (then clipped to [0, Lk)).
  bool has_lower_ = false, has_upper_ = false;
  std::int64_t lower_ = 0, upper_ = 0;
  // Neighborhood: per-axis grid length, kernel size, dilation and causality.
  int grid_rank_ = 1;
  std::array<std::int64_t, 3> grid_{1, 1, 1};
  NeighborhoodOptions options_{};
};

}  // namespace fmha::reference
