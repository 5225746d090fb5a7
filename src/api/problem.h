// What validation learns about a call: the sizes every backend reads, resolved once.
#pragma once

#include <array>
#include <cstdint>

namespace fmha::detail {

enum class Layout : std::uint8_t {
  kDense,         // q [B, Lq, H, D]
  kVarlen,        // q [total_q, H, D] with cu_seqlens
  kNeighborhood,  // q [B, X1, (X2, (X3)), H, D]
};

struct ProblemShape {
  Layout layout = Layout::kDense;
  std::int64_t batch = 0;      // B; varlen: number of sequences
  std::int64_t heads = 0;      // H
  std::int64_t kv_heads = 0;   // Hkv
  std::int64_t head_dim = 0;   // D
  std::int64_t value_dim = 0;  // Dv
  std::int64_t seqlen_q = 0;   // Lq; varlen: max_seqlen_q; neighborhood: product of the grid
  std::int64_t seqlen_k = 0;   // Lk; likewise
  std::int64_t total_q = 0;    // varlen: rows of q; otherwise batch * seqlen_q
  std::int64_t total_k = 0;    // varlen: rows of k; otherwise batch * seqlen_k
  std::int64_t num_extra = 0;  // R, extra keys per batch
  std::int64_t rel_h_size = 0; // Hk when rel-pos is given
  std::int64_t rel_w_size = 0; // Wk when rel-pos is given
  float scale = 1.0f;          // resolved: options.scale or 1 / sqrt(D)
  int grid_rank = 0;           // neighborhood: 1..3
  std::array<std::int64_t, 3> grid{1, 1, 1};  // neighborhood: X1, X2, X3 (1 past grid_rank)
};

}  // namespace fmha::detail
