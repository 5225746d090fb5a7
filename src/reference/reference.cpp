// Adapters from the six shaped entry points to the generic core (attention_core.h). Each one only
// says, per sequence b, how long it is, where its rows live and which keys each query sees.
#include "reference/reference.h"

#include "reference/attention_core.h"

namespace fmha::reference {
namespace {

// The token-major tensors of a call; null where the entry point has none.
struct CallTensors {
  const TensorView* q = nullptr;
  const TensorView* k = nullptr;
  const TensorView* v = nullptr;
  const TensorView* out = nullptr;
  const TensorView* lse = nullptr;
  const TensorView* dout = nullptr;
  const TensorView* dlse = nullptr;
  const TensorView* dq = nullptr;
  const TensorView* dk = nullptr;
  const TensorView* dv = nullptr;
};

template <typename Params>
CallTensors forward_tensors(const Params& p) {
  return {.q = &p.q, .k = &p.k, .v = &p.v, .out = &p.out, .lse = &p.lse};
}

// out and lse of the backward params are deliberately left out: the core recomputes them.
template <typename Params>
CallTensors backward_tensors(const Params& p) {
  return {.q = &p.q,
          .k = &p.k,
          .v = &p.v,
          .dout = &p.dout,
          .dlse = &p.dlse,
          .dq = &p.grads.dq,
          .dk = &p.grads.dk,
          .dv = &p.grads.dv};
}

// Where the dimensions of a token-major tensor are: the sequence starts at index `base_index` of
// dimension base_dim (batch b, or row cu_seqlens[b] of a packed tensor); the token grid occupies
// grid_rank dimensions from first_token_dim; feature_dim is -1 for lse-like tensors.
struct RowLayout {
  int base_dim, first_token_dim, head_dim, feature_dim;
};

// The rows of one sequence of one tensor: grid_rank token axes of the given extents.
struct SequenceRows {
  std::int64_t base_index;
  int grid_rank;
  std::array<std::int64_t, 3> extent;
};

TokenRows token_rows(const TensorView* view, const RowLayout& layout, const SequenceRows& seq) {
  TokenRows rows;
  rows.view = view;
  if (view == nullptr || !view->defined()) return rows;
  const auto stride = [&](int dim) { return view->stride[static_cast<std::size_t>(dim)]; };
  rows.base = seq.base_index * stride(layout.base_dim);
  rows.grid_rank = seq.grid_rank;
  rows.extent = seq.extent;
  for (int r = 0; r < seq.grid_rank; ++r)
    rows.stride[static_cast<std::size_t>(r)] = stride(layout.first_token_dim + r);
  rows.head_stride = stride(layout.head_dim);
  rows.feature_stride = layout.feature_dim >= 0 ? stride(layout.feature_dim) : 0;
  return rows;
}

// Query-side tensors (q, out, dout, dq) and key-side tensors (k, v, dk, dv) share `tokens`;
// lse-like tensors (lse, dlse) use `lse`.
SequenceView make_sequence(const CallTensors& t, const RowLayout& tokens, const RowLayout& lse,
                           const SequenceRows& queries, const SequenceRows& keys,
                           Visibility visibility) {
  SequenceView s;
  s.len_q = queries.extent[0] * queries.extent[1] * queries.extent[2];
  s.len_k = keys.extent[0] * keys.extent[1] * keys.extent[2];
  s.q = token_rows(t.q, tokens, queries);
  s.out = token_rows(t.out, tokens, queries);
  s.dout = token_rows(t.dout, tokens, queries);
  s.dq = token_rows(t.dq, tokens, queries);
  s.k = token_rows(t.k, tokens, keys);
  s.v = token_rows(t.v, tokens, keys);
  s.dk = token_rows(t.dk, tokens, keys);
  s.dv = token_rows(t.dv, tokens, keys);
  s.lse = token_rows(t.lse, lse, queries);
  s.dlse = token_rows(t.dlse, lse, queries);
  s.visibility = std::move(visibility);
  return s;
}

// What every layout shares: sizes, scale, score modifiers, sinks and extra keys.
AttentionProblem shared_problem(const AttentionOptions& o, const detail::ProblemShape& shape) {
  AttentionProblem p;
  p.num_sequences = shape.batch;
  p.heads = shape.heads;
  p.kv_heads = shape.kv_heads;
  p.head_dim = shape.head_dim;
  p.value_dim = shape.value_dim;
  p.num_extra = o.extra_k.defined() ? shape.num_extra : 0;
  p.scale = shape.scale;
  p.softcap = o.softcap;
  p.bias.view = &o.bias;
  p.rel_h.view = &o.rel_h;
  p.rel_w.view = &o.rel_w;
  p.rel_h_size = shape.rel_h_size;
  p.rel_w_size = shape.rel_w_size;
  p.sinks = o.sinks.defined() ? &o.sinks : nullptr;
  p.extra_k = o.extra_k.defined() ? &o.extra_k : nullptr;
  p.extra_v = o.extra_v.defined() ? &o.extra_v : nullptr;
  return p;
}

// ---- Dense: q [B, Lq, H, D], lse [B, H, Lq]
// -------------------------------------------------------

constexpr RowLayout kDenseTokens{
    .base_dim = 0, .first_token_dim = 1, .head_dim = 2, .feature_dim = 3};
constexpr RowLayout kDenseLse{
    .base_dim = 0, .first_token_dim = 2, .head_dim = 1, .feature_dim = -1};

AttentionProblem dense_problem(const CallTensors& t, const AttentionOptions& o,
                               const detail::ProblemShape& shape) {
  AttentionProblem p = shared_problem(o, shape);
  p.sequence = [t, &o, &shape](std::int64_t b) {
    return make_sequence(t, kDenseTokens, kDenseLse, {b, 1, {shape.seqlen_q, 1, 1}},
                         {b, 1, {shape.seqlen_k, 1, 1}},
                         Visibility::band(shape.seqlen_q, shape.seqlen_k, o.causal,
                                          o.causal_alignment, o.window_left, o.window_right));
  };
  return p;
}

// ---- Varlen: q [total_q, H, D], lse [H, total_q]; sequence b owns rows cu[b] .. cu[b + 1] - 1
// ------

constexpr RowLayout kPackedTokens{
    .base_dim = 0, .first_token_dim = 0, .head_dim = 1, .feature_dim = 2};
constexpr RowLayout kPackedLse{
    .base_dim = 1, .first_token_dim = 1, .head_dim = 0, .feature_dim = -1};

// cu_seqlens lives in host memory for the CPU backend.
std::int64_t cu_seqlen(const TensorView& cu, std::int64_t b) {
  return static_cast<const std::int32_t*>(cu.data)[b * cu.stride[0]];
}

template <typename Params>
AttentionProblem varlen_problem(const CallTensors& t, const Params& params,
                                const detail::ProblemShape& shape) {
  const AttentionOptions& o = params.options;
  AttentionProblem p = shared_problem(o, shape);
  p.sequence = [t, &o, &cu_q = params.cu_seqlens_q, &cu_k = params.cu_seqlens_k](std::int64_t b) {
    const std::int64_t first_q = cu_seqlen(cu_q, b), len_q = cu_seqlen(cu_q, b + 1) - first_q;
    const std::int64_t first_k = cu_seqlen(cu_k, b), len_k = cu_seqlen(cu_k, b + 1) - first_k;
    return make_sequence(t, kPackedTokens, kPackedLse, {first_q, 1, {len_q, 1, 1}},
                         {first_k, 1, {len_k, 1, 1}},
                         Visibility::band(len_q, len_k, o.causal, o.causal_alignment, o.window_left,
                                          o.window_right));
  };
  return p;
}

// ---- Neighborhood: q [B, X1, (X2, (X3)), H, D], lse [B, H, X1, (X2, (X3))]
// -------------------------

AttentionProblem neighborhood_problem(const CallTensors& t, const NeighborhoodOptions& na,
                                      const AttentionOptions& o,
                                      const detail::ProblemShape& shape) {
  AttentionProblem p = shared_problem(o, shape);
  const int rank = shape.grid_rank;
  const RowLayout tokens{
      .base_dim = 0, .first_token_dim = 1, .head_dim = rank + 1, .feature_dim = rank + 2};
  const RowLayout lse{.base_dim = 0, .first_token_dim = 2, .head_dim = 1, .feature_dim = -1};
  std::array<std::int64_t, 3> grid{1, 1, 1};
  for (int r = 0; r < rank; ++r)
    grid[static_cast<std::size_t>(r)] = shape.grid[static_cast<std::size_t>(r)];
  const Visibility visibility = Visibility::neighborhood(na, rank, grid);
  p.sequence = [t, tokens, lse, rank, grid, visibility](std::int64_t b) {
    return make_sequence(t, tokens, lse, {b, rank, grid}, {b, rank, grid}, visibility);
  };
  return p;
}

}  // namespace

void run(const AttentionForwardParams& p, const detail::ProblemShape& shape) {
  attention_forward(dense_problem(forward_tensors(p), p.options, shape));
}

void run(const AttentionBackwardParams& p, const detail::ProblemShape& shape) {
  attention_backward(dense_problem(backward_tensors(p), p.options, shape), p.grads);
}

void run(const VarlenForwardParams& p, const detail::ProblemShape& shape) {
  attention_forward(varlen_problem(forward_tensors(p), p, shape));
}

void run(const VarlenBackwardParams& p, const detail::ProblemShape& shape) {
  attention_backward(varlen_problem(backward_tensors(p), p, shape), p.grads);
}

void run(const NeighborhoodForwardParams& p, const detail::ProblemShape& shape) {
  attention_forward(neighborhood_problem(forward_tensors(p), p.neighborhood, p.options, shape));
}

void run(const NeighborhoodBackwardParams& p, const detail::ProblemShape& shape) {
  attention_backward(neighborhood_problem(backward_tensors(p), p.neighborhood, p.options, shape),
                     p.grads);
}

}  // namespace fmha::reference
