// What the fast CPU kernels see of a call: the sequences, where each tensor's rows live, and the
// band of keys each query sees. backend.cpp builds one from the dense or varlen parameters; the
// kernels (forward.cpp, backward.cpp) never look at the parameter structs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "fmha/params.h"

namespace fmha::cpu {

struct NeighborhoodGeometry;  // neighborhood.h

// A token-major tensor: element (sequence batch b, token t, head h, feature d) sits at
// b * batch_stride + t * token_stride + h * head_stride + d * feature_stride. Dense tensors
// [B, L, H, D] index t inside the batch; packed varlen tensors [total, H, D] have no batch stride
// and index t over all rows. lse-like tensors have no feature dimension.
struct Operand {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::int64_t batch_stride = 0, token_stride = 0, head_stride = 0, feature_stride = 0;

  bool given() const { return data != nullptr; }
  std::int64_t offset(std::int64_t b, std::int64_t token, std::int64_t head) const {
    return b * batch_stride + token * token_stride + head * head_stride;
  }
};

// One sequence: batch b of a dense call, or the rows cu_seqlens[b] .. cu_seqlens[b + 1] - 1 of a
// packed one. first_q / first_k are the token indices of its first query / key in the operands;
// row is the index of its first query among all queries of the call (scratch buffers use it).
struct Sequence {
  std::int64_t batch = 0;
  std::int64_t index = 0;  // its place in the call: the bias's batch index (varlen too)
  std::int64_t first_q = 0, len_q = 0;
  std::int64_t first_k = 0, len_k = 0;
  std::int64_t row = 0;
};

// Causal masks and windows over one sequence (SPEC §3): key j is visible to query i iff
// i + lower <= j <= i + upper, each bound present only when a mask sets it.
struct Band {
  bool has_lower = false, has_upper = false;
  std::int64_t lower = 0, upper = 0;

  // The band of options o (its causal, causal_alignment and window fields) over one sequence.
  static Band of(const AttentionOptions& o, std::int64_t len_q, std::int64_t len_k) {
    Band band;
    const std::int64_t diagonal =
        o.causal_alignment == CausalAlignment::kBottomRight ? len_k - len_q : 0;
    if (o.window_left >= 0) {
      band.has_lower = true;
      band.lower = diagonal - o.window_left;
    }
    if (o.causal) {
      band.has_upper = true;
      band.upper = diagonal;
    }
    if (o.window_right >= 0) {
      band.upper = band.has_upper ? std::min(band.upper, diagonal + o.window_right)
                                  : diagonal + o.window_right;
      band.has_upper = true;
    }
    return band;
  }
  // Visible keys of query i: [first_key(i), last_key(i)], empty when last < first.
  std::int64_t first_key(std::int64_t i) const {
    return has_lower ? std::max<std::int64_t>(i + lower, 0) : 0;
  }
  std::int64_t last_key(std::int64_t i, std::int64_t len_k) const {
    return has_upper ? std::min(i + upper, len_k - 1) : len_k - 1;
  }
  // Queries that see key j: [first_query(j), last_query(j)].
  std::int64_t first_query(std::int64_t j) const {
    return has_upper ? std::max<std::int64_t>(j - upper, 0) : 0;
  }
  std::int64_t last_query(std::int64_t j, std::int64_t len_q) const {
    return has_lower ? std::min(j - lower, len_q - 1) : len_q - 1;
  }
  // Sets to -inf the scores row[0 .. cols) of query i, keys k0 .. k0 + cols - 1, that the band
  // hides: a run before its first visible key and one after its last.
  void mask_row(std::int64_t i, std::int64_t k0, std::int64_t cols, float* row) const {
    const float hidden = -std::numeric_limits<float>::infinity();
    const std::int64_t begin = has_lower ? std::clamp<std::int64_t>(i + lower - k0, 0, cols) : 0;
    const std::int64_t end =
        has_upper ? std::clamp<std::int64_t>(i + upper - k0 + 1, 0, cols) : cols;
    for (std::int64_t j = 0; j < begin; ++j) row[j] = hidden;
    for (std::int64_t j = std::max(end, begin); j < cols; ++j) row[j] = hidden;
  }
  // True when every query of [q0, q0 + rows) sees every key of [k0, k0 + cols).
  bool covers(std::int64_t q0, std::int64_t rows, std::int64_t k0, std::int64_t cols) const {
    return (!has_lower || k0 >= q0 + rows - 1 + lower) &&
           (!has_upper || k0 + cols - 1 <= q0 + upper);
  }
};

// An additive score term read element by element: the bias [B, H, Lq, Lk], or rel_h / rel_w
// [B, H, Lq, Hk | Wk]; element (b, h, i, c) at b * stride[0] + h * stride[1] + i * stride[2] +
// c * stride[3] (a broadcast dimension has stride 0).
struct ScoreTerm {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::int64_t stride[4] = {0, 0, 0, 0};

  bool given() const { return data != nullptr; }
  std::int64_t row(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return b * stride[0] + h * stride[1] + i * stride[2];
  }
};

// Everything one call of the fast backend reads and writes.
struct Call {
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0, value_dim = 0;
  std::int64_t total_q = 0;  // queries over all sequences
  float scale = 1.0f;
  float softcap = 0.0f;
  const AttentionOptions* options = nullptr;         // the call's; Band::of reads its masks
  // Neighborhood calls (SPEC §6): the grid's geometry; each sequence is one batch's grid, its
  // tokens row-major. Null for dense and varlen calls, whose masks are bands.
  const NeighborhoodGeometry* neighborhood = nullptr;
  BackwardImpl backward_impl = BackwardImpl::kAuto;  // fused or split backward (backward.cpp)
  int threads = 1;                                   // resolved thread count (parallel.h)
  // The threads the problem's size warrants (backend.cpp), whatever the request: a choice made from
  // it keeps the results independent of the thread count.
  int work_threads = 1;
  std::vector<Sequence> sequences;
  Operand q, k, v, out, lse;  // lse optional in the forward, required by the backward
  Operand dout, dlse;         // backward inputs; dlse optional
  Operand dq, dk, dv;         // backward outputs
  Operand sinks, dsinks;      // [H] fp32: head_stride only; optional
  // Extra keys (SPEC §7) [B, R, Hkv, D | Dv], batch index the sequence's index (varlen too), and
  // their gradients: keys every query sees after its sequence's, unmasked, without bias or rel-pos.
  // Optional (num_extra 0 without them); dextra_k / dextra_v each optional in the backward.
  Operand extra_k, extra_v, dextra_k, dextra_v;
  std::int64_t num_extra = 0;
  ScoreTerm bias, rel_h, rel_w;  // dense calls only; optional
  // The bias's gradient, only when it has no broadcast dimension: each element belongs to one
  // (b, h, i, j), written by the task that owns query row i (backward.cpp).
  ScoreTerm dbias;
  // dbias broadcast over some of [batch, heads, query rows, keys] ([1, H, Lq, Lk], [B, 1, 1, Lk],
  // ... of a dense call): the sum over them, taken by one dQ-pass task per query tile, head and
  // sequence it does not sum over, which takes the sequences, heads and query tiles it sums in order
  // (backward.cpp). All false: dbias has no broadcast dimension.
  bool dbias_sums[4] = {false, false, false, false};

  bool dbias_summed() const {
    return dbias_sums[0] || dbias_sums[1] || dbias_sums[2] || dbias_sums[3];
  }
  // rel_h / rel_w's gradients under the same condition: row i's sums over its keys' grid columns /
  // rows, accumulated in fp32 by the task that owns the row (rel_h_size = Hk).
  ScoreTerm drel_h, drel_w;
  std::int64_t rel_h_size = 0;
  std::int64_t rel_w_size = 0;   // Wk: key j takes rel_h column j / Wk and rel_w column j % Wk

  std::int64_t group() const { return heads / kv_heads; }
  bool wants_drel() const { return drel_h.given() || drel_w.given(); }
};

}  // namespace fmha::cpu
