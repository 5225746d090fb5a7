// The generic attention core of the CPU reference: one forward and one backward, written once, in
// double precision. The entry points (dense, varlen, neighborhood) are thin adapters that describe
// each sequence b: its lengths, where its rows of q/k/v/out/... live, and which keys each query
// sees.
#pragma once

#include <array>
#include <cstdint>
#include <functional>

#include "fmha/params.h"
#include "reference/visibility.h"

namespace fmha::reference {

// Addresses the rows of one sequence in a token-major tensor [tokens on a 1..3-D grid, heads,
// features]: dense [B, L, H, D] at batch b, varlen [total, H, D] from cu_seqlens[b], neighborhood
// [B, X1, (X2, (X3)), H, D]; also lse-like tensors, which have no feature dimension.
struct TokenRows {
  const TensorView* view = nullptr;  // null (or rank 0) when the tensor is not given
  std::int64_t base = 0;             // offset of token 0, head 0
  int grid_rank = 1;
  std::array<std::int64_t, 3> extent{1, 1, 1};  // tokens per grid axis, row-major
  std::array<std::int64_t, 3> stride{0, 0, 0};
  std::int64_t head_stride = 0;
  std::int64_t feature_stride = 0;

  bool given() const { return view != nullptr && view->defined(); }
  // Offset of element (token, head, feature); `token` is the row-major index over the grid.
  std::int64_t offset(std::int64_t token, std::int64_t head, std::int64_t feature = 0) const {
    std::int64_t result = base + head * head_stride + feature * feature_stride;
    for (int r = grid_rank - 1; r >= 0; --r) {
      const auto axis = static_cast<std::size_t>(r);
      result += (token % extent[axis]) * stride[axis];
      token /= extent[axis];
    }
    return result;
  }
};

// A tensor of logical shape [B, H, Lq, X] (bias [.., Lk], rel_h [.., Hk], rel_w [.., Wk] and their
// gradients); a dimension of size 1 or stride 0 broadcasts.
struct BroadcastOperand {
  const TensorView* view = nullptr;

  bool given() const { return view != nullptr && view->defined(); }
  bool broadcasts(int dim) const {
    const auto d = static_cast<std::size_t>(dim);
    return view->shape[d] == 1 || view->stride[d] == 0;
  }
  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t x) const {
    const std::int64_t index[4] = {b, h, i, x};
    std::int64_t result = 0;
    for (int d = 0; d < 4; ++d) {
      if (!broadcasts(d)) result += index[d] * view->stride[static_cast<std::size_t>(d)];
    }
    return result;
  }
};

// One sequence as the adapter describes it. Positions (i, j, masks, bias indices) are the positions
// inside the sequence.
struct SequenceView {
  std::int64_t len_q = 0, len_k = 0;
  TokenRows q, k, v;
  TokenRows out, lse;    // forward outputs; lse optional
  TokenRows dout, dlse;  // backward inputs; dlse optional
  TokenRows dq, dk, dv;  // backward outputs
  Visibility visibility;
};

// Everything the sequences of one call share.
struct AttentionProblem {
  std::int64_t num_sequences = 0;  // B; varlen: number of sequences
  std::int64_t heads = 0, kv_heads = 0;
  std::int64_t head_dim = 0, value_dim = 0;
  std::int64_t num_extra = 0;  // R
  double scale = 1.0;
  double softcap = 0.0;  // 0: off
  BroadcastOperand bias, rel_h, rel_w;
  std::int64_t rel_h_size = 0;          // Hk
  std::int64_t rel_w_size = 0;          // Wk: key j sits at grid row j / Wk, column j % Wk
  const TensorView* sinks = nullptr;    // [H]
  const TensorView* extra_k = nullptr;  // [B, R, Hkv, D]
  const TensorView* extra_v = nullptr;  // [B, R, Hkv, Dv]
  std::function<SequenceView(std::int64_t)> sequence;  // describes sequence b
};

// Writes out (and lse when given) of every sequence (SPEC §2-§10).
void attention_forward(const AttentionProblem& problem);

// Writes every gradient in `grads` (SPEC §11); dq/dk/dv of the sequences are addressed through
// SequenceView, the others (dbias, drel_*, dsinks, dextra_*) through `grads` itself.
void attention_backward(const AttentionProblem& problem, const AttentionGradients& grads);

}  // namespace fmha::reference
