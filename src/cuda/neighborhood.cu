// CUDA backend entry points of neighborhood attention (SPEC §6). The grid's tokens are flattened
// row-major, so NA runs as the dense forward and backward (forward_setup.h, backward_setup.h)
// with the neighborhood mask policy (cuda/common/neighborhood_mask.cuh): q [B, X1, (X2, (X3)), H,
// D] becomes [B, N, H, D] with one token stride, lse [B, H, X...] becomes [B, H, N], and bias /
// rel-pos already index the flattened grid. A 1-D grid without dilation runs as a window mask
// (set_neighborhood_mask), and so does a dilated 1-D grid of one batch whose dilation divides it,
// its dilation groups taken as batches (dilation_groups).
#include <cstdint>
#include <limits>
#include <string>

#include "cuda/backend.h"
#include "cuda/backward_setup.h"
#include "cuda/common/forward_params.h"
#include "cuda/dispatch_fwd.h"
#include "cuda/forward_setup.h"

namespace fmha::cuda {
namespace {

// Grids up to this many tokens keep every token index, plus the rows and keys a tile reaches past
// the end (< 256), in int32, which the mask's per-element test uses.
constexpr std::int64_t kMaxTokens = std::numeric_limits<std::int32_t>::max() - 256;

std::string strides_string(const TensorView& t) {
  std::string s = "[";
  for (int d = 0; d < t.rank; ++d) {
    if (d > 0) s += ", ";
    s += std::to_string(t.stride[static_cast<std::size_t>(d)]);
  }
  return s + "]";
}

// The single token stride of a tensor whose grid axes (dims first_axis .. first_axis + rank - 1)
// are row-major over the tokens: each axis's stride is the token stride times the number of tokens
// of the axes inside it. Axes of size 1 may have any stride. False when the axes do not collapse.
bool token_stride(const TensorView& t, int first_axis, int rank, std::int64_t* stride) {
  bool found = false;
  std::int64_t token = 0, inner = 1;  // inner: tokens per step along the current axis
  for (int r = rank - 1; r >= 0; --r) {
    const auto axis = static_cast<std::size_t>(first_axis + r);
    const std::int64_t size = t.shape[axis], axis_stride = t.stride[axis];
    if (size != 1) {
      if (axis_stride % inner != 0) return false;
      if (!found) {
        token = axis_stride / inner;
        found = true;
      } else if (axis_stride / inner != token) {
        return false;
      }
    }
    inner *= size;
  }
  *stride = token;
  return true;
}

Status expect_token_stride(const TensorView& t, const char* name, int first_axis, int rank,
                           std::int64_t* stride) {
  if (token_stride(t, first_axis, rank, stride)) return Status::ok_status();
  return Status::not_supported(
      std::string("fmha: the CUDA neighborhood attention kernel flattens the grid into one token "
                  "stride, so the grid axes of ") +
      name +
      " must be row-major over its tokens (each axis's stride = the next axis's stride x "
      "that axis's size); got " +
      name + " of shape " + t.shape_string() + " and strides " + strides_string(t) +
      ": make it contiguous over its grid axes, or run on CPU tensors");
}

// `t` with its grid axes (dims first_axis .. first_axis + rank - 1) merged into one token dim of
// the collapsed token stride: q [B, X..., H, D] -> [B, N, H, D], lse [B, H, X...] -> [B, H, N].
// Views not given stay not given.
Status flatten_grid(const TensorView& t, const char* name, int first_axis, int rank,
                    TensorView* flat) {
  *flat = t;
  if (!t.defined()) return Status::ok_status();
  std::int64_t stride = 0;
  FMHA_RETURN_IF_ERROR(expect_token_stride(t, name, first_axis, rank, &stride));
  std::int64_t tokens = 1;
  for (int r = 0; r < rank; ++r) tokens *= t.shape[static_cast<std::size_t>(first_axis + r)];
  flat->rank = t.rank - rank + 1;
  flat->shape[static_cast<std::size_t>(first_axis)] = tokens;
  flat->stride[static_cast<std::size_t>(first_axis)] = stride;
  for (int d = first_axis + 1; d < flat->rank; ++d) {
    const auto from = static_cast<std::size_t>(d + rank - 1), to = static_cast<std::size_t>(d);
    flat->shape[to] = t.shape[from];
    flat->stride[to] = t.stride[from];
  }
  return Status::ok_status();
}

NeighborhoodGrid grid_of(const NeighborhoodOptions& na, const detail::ProblemShape& shape) {
  NeighborhoodGrid g;
  g.rank = shape.grid_rank;
  for (int r = 0; r < shape.grid_rank; ++r) {
    const auto axis = static_cast<std::size_t>(r);
    // Validation bounds each size by the token count and K * d by the size: all fit in int.
    g.size[r] = static_cast<int>(shape.grid[axis]);
    g.kernel[r] = static_cast<int>(na.kernel_size[axis]);
    g.dilation[r] = static_cast<int>(na.dilation[axis]);
    g.causal[r] = na.causal[axis];
  }
  return g;
}

Status check_token_count(const detail::ProblemShape& shape) {
  if (shape.seqlen_q <= kMaxTokens) return Status::ok_status();
  return Status::not_supported(
      "fmha: the CUDA neighborhood attention kernels take grids of at most " +
      std::to_string(kMaxTokens) + " tokens (32-bit token indices); got " +
      std::to_string(shape.seqlen_q) + " tokens");
}

// ---- Dilation groups as batches ------------------------------------------------------------------
// A 1-D neighborhood of dilation d over X tokens is d undilated neighborhoods of the same kernel,
// one per dilation group: group g holds tokens g, g + d, g + 2d, .. (SPEC §6: a query sees keys of
// its own group, through a window over the group's positions clamped at the group's ends). When d
// divides X every group has X / d tokens, and a batch of one is a batch of d groups over strided
// views of the same tensors (group g starts at token g, its rows d tokens apart): the dense
// kernels' window mask then runs it, with range tiles and their full-tile fast path, instead of
// the token tiles' gathered rows and per-row window tests.
// Kept to the cases where nothing sums over the groups' queries into a tensor that has a batch
// dimension: a bias or rel-pos (and their gradients) and extra-key gradients keep the token
// tiles; dsinks sums over batches as it sums over rows.

// The number of dilation groups the problem runs as batches (1: it does not).
std::int64_t dilation_groups(const NeighborhoodGrid& g, const detail::ProblemShape& shape,
                             const AttentionOptions& o, const AttentionGradients* grads) {
  if (shape.batch != 1 || o.bias.defined() || o.rel_h.defined()) return 1;
  if (grads != nullptr && shape.num_extra > 0 &&
      (grads->dextra_k.defined() || grads->dextra_v.defined())) {
    return 1;
  }
  int long_axes = 0, axis = 0;
  for (int r = 0; r < g.rank; ++r) {
    if (g.size[r] > 1) {
      ++long_axes;
      axis = r;
    }
  }
  const int d = g.dilation[axis];
  if (long_axes != 1 || d == 1 || g.size[axis] % d != 0 || d > kMaxGridYZ) return 1;
  return d;
}

// `t` of batch 1 with its tokens at dim `token_dim` ([1, N, H, D], or [1, H, N] for statistics)
// as [groups, ..., N / groups, ...]: batch g holds tokens g, g + groups, ..
void group_rows(TensorView* t, int token_dim, std::int64_t groups) {
  if (!t->defined()) return;
  const auto dim = static_cast<std::size_t>(token_dim);
  t->shape[0] = groups;
  t->stride[0] = t->stride[dim];
  t->shape[dim] /= groups;
  t->stride[dim] *= groups;
}

// Every group sees the one batch's extra keys.
void ungroup_extra_keys(AttentionOptions* o, std::int64_t groups) {
  for (TensorView* t : {&o->extra_k, &o->extra_v}) {
    if (!t->defined()) continue;
    t->shape[0] = groups;
    t->stride[0] = 0;
  }
}

// The problem's shape and grid once its groups are batches: d batches of X / d tokens, no
// dilation (set_neighborhood_mask then takes the window mask).
void groups_as_batches(std::int64_t groups, detail::ProblemShape* shape, NeighborhoodGrid* g) {
  shape->batch = groups;
  shape->seqlen_q /= groups;
  shape->seqlen_k /= groups;
  for (int r = 0; r < g->rank; ++r) {
    if (g->size[r] == 1) continue;
    g->size[r] /= static_cast<int>(groups);
    g->dilation[r] = 1;
    shape->grid[static_cast<std::size_t>(r)] = g->size[r];
  }
}

}  // namespace

void set_neighborhood_mask(const NeighborhoodGrid& grid, ForwardParams* p) {
  if (grid.rank == 0) return;  // dense attention: its own mask stays
  int long_axes = 0, axis = 0;
  for (int r = 0; r < grid.rank; ++r) {
    if (grid.size[r] > 1) {
      ++long_axes;
      axis = r;
    }
  }
  if (long_axes > 1 || grid.dilation[axis] != 1) {
    p->neighborhood = grid;
    return;
  }
  // One axis, tokens consecutive: query p sees keys max(p - K + 1, 0) .. p when causal, else
  // start .. start + K - 1 with start = clamp(p - K/2, 0, X - K), i.e. the window
  // (K/2, K - 1 - K/2) shifted inward at the borders. Axes of size 1 have kernel 1.
  const int k = grid.kernel[axis];
  p->neighborhood = NeighborhoodGrid{};
  p->bottom_right = false;
  p->window_left = grid.causal[axis] ? k - 1 : k / 2;
  p->window_right = grid.causal[axis] ? 0 : k - 1 - k / 2;
  p->window_shifts_at_borders = !grid.causal[axis];
}

Status run(const NeighborhoodForwardParams& a, const detail::ProblemShape& shape, void* stream) {
  FMHA_RETURN_IF_ERROR(check_forward_dtype(a.q.dtype));
  if (shape.seqlen_q == 0 || shape.batch == 0 || shape.heads == 0) return Status::ok_status();
  FMHA_RETURN_IF_ERROR(check_token_count(shape));
  const int rank = shape.grid_rank;
  AttentionForwardParams dense;
  FMHA_RETURN_IF_ERROR(flatten_grid(a.q, "q", 1, rank, &dense.q));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.k, "k", 1, rank, &dense.k));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.v, "v", 1, rank, &dense.v));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.out, "out", 1, rank, &dense.out));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.lse, "lse", 2, rank, &dense.lse));  // [B, H, X...]
  dense.options = a.options;
  detail::ProblemShape flat = shape;
  NeighborhoodGrid grid = grid_of(a.neighborhood, shape);
  const std::int64_t groups = dilation_groups(grid, shape, a.options, /*grads=*/nullptr);
  if (groups > 1) {
    for (TensorView* t : {&dense.q, &dense.k, &dense.v, &dense.out}) group_rows(t, 1, groups);
    group_rows(&dense.lse, 2, groups);
    ungroup_extra_keys(&dense.options, groups);
    groups_as_batches(groups, &flat, &grid);
  }
  return run_dense_forward(dense, flat, grid, stream);
}

// The backward is the dense backward on the flattened views, with the grid's mask policy.
Status run(const NeighborhoodBackwardParams& a, const detail::ProblemShape& shape, void* stream) {
  FMHA_RETURN_IF_ERROR(check_token_count(shape));
  const int rank = shape.grid_rank;
  AttentionBackwardParams dense;
  FMHA_RETURN_IF_ERROR(flatten_grid(a.q, "q", 1, rank, &dense.q));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.k, "k", 1, rank, &dense.k));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.v, "v", 1, rank, &dense.v));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.out, "out", 1, rank, &dense.out));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.dout, "dout", 1, rank, &dense.dout));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.lse, "lse", 2, rank, &dense.lse));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.dlse, "dlse", 2, rank, &dense.dlse));
  dense.options = a.options;
  dense.backward_impl = a.backward_impl;
  dense.grads = a.grads;  // bias, rel-pos and extra-key gradients are not grid-shaped
  FMHA_RETURN_IF_ERROR(flatten_grid(a.grads.dq, "grads.dq", 1, rank, &dense.grads.dq));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.grads.dk, "grads.dk", 1, rank, &dense.grads.dk));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.grads.dv, "grads.dv", 1, rank, &dense.grads.dv));
  detail::ProblemShape flat = shape;
  NeighborhoodGrid grid = grid_of(a.neighborhood, shape);
  const std::int64_t groups = dilation_groups(grid, shape, a.options, &a.grads);
  if (groups > 1) {
    for (TensorView* t : {&dense.q, &dense.k, &dense.v, &dense.out, &dense.dout, &dense.grads.dq,
                          &dense.grads.dk, &dense.grads.dv}) {
      group_rows(t, 1, groups);
    }
    group_rows(&dense.lse, 2, groups);
    group_rows(&dense.dlse, 2, groups);
    ungroup_extra_keys(&dense.options, groups);
    groups_as_batches(groups, &flat, &grid);
  }
  return run_dense_backward(dense, flat, grid, stream);
}

}  // namespace fmha::cuda
