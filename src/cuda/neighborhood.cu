// CUDA backend entry points of neighborhood attention (SPEC §6). The grid's tokens are flattened
// row-major, so NA runs as the dense forward and backward (forward_setup.h, backward_setup.h)
// with the neighborhood mask policy (cuda/common/neighborhood_mask.cuh): q [B, X1, (X2, (X3)), H,
// D] becomes [B, N, H, D] with one token stride, lse [B, H, X...] becomes [B, H, N], and bias /
// rel-pos already index the flattened grid. A 1-D grid without dilation runs as a window mask
// (set_neighborhood_mask), and so do the dilation groups of a dilated one (dilation_groups).
#include <algorithm>
#include <cstdint>
#include <initializer_list>
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

// ---- Dilation groups ----------------------------------------------------------------------------
// A 1-D neighborhood of dilation d over X tokens is d undilated neighborhoods of the same kernel,
// one per dilation group: group g holds tokens g, g + d, g + 2d, .. (SPEC §6: a query sees keys of
// its own group, through a window over the group's positions clamped at the group's ends). On
// strided views of the same tensors (group g starts at token g, its rows d tokens apart) each is
// a window mask of the dense kernels, with range tiles and their full-tile fast path, instead of
// the token tiles' gathered rows and per-row window tests:
// - a batch of one whose dilation divides X runs its d groups as the batches of one launch;
// - otherwise each group is a launch over the whole batch (up to kMaxGroupLaunches of them; past
//   that the groups are short and the launches many: token tiles), dsinks added up over them.
// A bias or rel-pos (whose gradients would need the same views, with zeros between the groups)
// and extra-key gradients (written per batch) keep the token tiles.

enum class GroupRun { kTokenTiles, kBatches, kLaunches };

struct DilationGroups {
  GroupRun run = GroupRun::kTokenTiles;
  int axis = 0;   // the grid's one axis of more than one token
  int count = 1;  // d
};

constexpr int kMaxGroupLaunches = 16;

DilationGroups dilation_groups(const NeighborhoodGrid& g, const detail::ProblemShape& shape,
                               const AttentionOptions& o, const AttentionGradients* grads) {
  DilationGroups groups;
  if (o.bias.defined() || o.rel_h.defined()) return groups;
  if (grads != nullptr && shape.num_extra > 0 &&
      (grads->dextra_k.defined() || grads->dextra_v.defined())) {
    return groups;
  }
  int long_axes = 0;
  for (int r = 0; r < g.rank; ++r) {
    if (g.size[r] > 1) {
      ++long_axes;
      groups.axis = r;
    }
  }
  const int d = g.dilation[groups.axis];
  if (long_axes != 1 || d == 1) return groups;
  groups.count = d;
  if (shape.batch == 1 && g.size[groups.axis] % d == 0 && d <= kMaxGridYZ) {
    groups.run = GroupRun::kBatches;
  } else if (d <= kMaxGroupLaunches) {
    groups.run = GroupRun::kLaunches;
  }
  return groups;
}

// The tokens of group `g` along an axis of `size` tokens.
int group_tokens(int size, int d, int g) {
  return (size - g + d - 1) / d;
}

// `t` of batch 1 with its tokens at dim `token_dim` ([1, N, H, D], or [1, H, N] for statistics)
// as [d, ..., N / d, ...]: batch g holds tokens g, g + d, ..
void groups_as_batch_rows(TensorView* t, int token_dim, int d) {
  if (!t->defined()) return;
  const auto dim = static_cast<std::size_t>(token_dim);
  t->shape[0] = d;
  t->stride[0] = t->stride[dim];
  t->shape[dim] /= d;
  t->stride[dim] *= d;
}

// Every group batch sees the one batch's extra keys.
void extra_keys_for_group_batches(AttentionOptions* o, int d) {
  for (TensorView* t : {&o->extra_k, &o->extra_v}) {
    if (!t->defined()) continue;
    t->shape[0] = d;
    t->stride[0] = 0;
  }
}

// Group g's rows of `t` (tokens at dim `token_dim`): tokens g, g + d, .., `tokens` of them.
void group_rows(TensorView* t, int token_dim, int d, int g, int tokens) {
  if (!t->defined()) return;
  const auto dim = static_cast<std::size_t>(token_dim);
  t->data = static_cast<char*>(t->data) + static_cast<std::int64_t>(g) * t->stride[dim] *
                                              static_cast<std::int64_t>(element_size(t->dtype));
  t->shape[dim] = tokens;
  t->stride[dim] *= d;
}

// The problem of one group (`tokens` along the axis, no dilation: set_neighborhood_mask then
// takes the window mask) over `batch` batches.
void group_problem(const DilationGroups& groups, std::int64_t batch, int tokens,
                   detail::ProblemShape* shape, NeighborhoodGrid* g) {
  shape->batch = batch;
  shape->seqlen_q = shape->seqlen_k = tokens;
  shape->total_q = shape->total_k = batch * tokens;
  shape->grid[static_cast<std::size_t>(groups.axis)] = tokens;
  g->size[groups.axis] = tokens;
  g->dilation[groups.axis] = 1;
}

// Runs the problem (`dense`, flattened, under `grid`) as `groups` says: one
// launch(params, shape, grid, first) on the whole grid (token tiles), one with the groups as
// batches, or one per group in group order. grid_views(params, each) calls each(view, token_dim)
// on every grid-shaped view of `params` (the ones the group runs restride); `first` is false on
// the launches after the first, whose sums over the launches (dsinks) add to the earlier ones.
template <typename Params, typename GridViews, typename Launch>
Status run_dilation_groups(const DilationGroups& groups, Params dense,
                           const detail::ProblemShape& shape, const NeighborhoodGrid& grid,
                           GridViews grid_views, Launch launch) {
  if (groups.run == GroupRun::kTokenTiles) return launch(dense, shape, grid, /*first=*/true);
  const int d = groups.count, size = grid.size[groups.axis];
  if (groups.run == GroupRun::kBatches) {
    grid_views(dense, [d](TensorView* t, int token_dim) { groups_as_batch_rows(t, token_dim, d); });
    extra_keys_for_group_batches(&dense.options, d);
    detail::ProblemShape group_shape = shape;
    NeighborhoodGrid group_grid = grid;
    group_problem(groups, d, size / d, &group_shape, &group_grid);
    return launch(dense, group_shape, group_grid, /*first=*/true);
  }
  for (int g = 0; g < d; ++g) {
    const int tokens = group_tokens(size, d, g);
    Params part = dense;
    grid_views(part, [&](TensorView* t, int token_dim) { group_rows(t, token_dim, d, g, tokens); });
    detail::ProblemShape group_shape = shape;
    NeighborhoodGrid group_grid = grid;
    group_problem(groups, shape.batch, tokens, &group_shape, &group_grid);
    FMHA_RETURN_IF_ERROR(launch(part, group_shape, group_grid, /*first=*/g == 0));
  }
  return Status::ok_status();
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

namespace {

// A neighborhood call as dense calls: the flattened views, the grid and its dilation groups.
template <typename DenseParams>
struct FlattenedCall {
  DenseParams dense;
  NeighborhoodGrid grid;
  DilationGroups groups;
};

// The grid-shaped views of the dense forward (tokens at dim 1, lse's at 2), for
// run_dilation_groups.
struct ForwardGridViews {
  template <typename Each>
  void operator()(AttentionForwardParams& p, Each&& each) const {
    for (TensorView* t : {&p.q, &p.k, &p.v, &p.out}) each(t, 1);
    each(&p.lse, 2);
  }
};

// Those of the dense backward.
struct BackwardGridViews {
  template <typename Each>
  void operator()(AttentionBackwardParams& p, Each&& each) const {
    for (TensorView* t :
         {&p.q, &p.k, &p.v, &p.out, &p.dout, &p.grads.dq, &p.grads.dk, &p.grads.dv}) {
      each(t, 1);
    }
    for (TensorView* t : {&p.lse, &p.dlse}) each(t, 2);
  }
};

Status flatten_forward(const NeighborhoodForwardParams& a, const detail::ProblemShape& shape,
                       FlattenedCall<AttentionForwardParams>* call) {
  const int rank = shape.grid_rank;
  AttentionForwardParams& dense = call->dense;
  FMHA_RETURN_IF_ERROR(flatten_grid(a.q, "q", 1, rank, &dense.q));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.k, "k", 1, rank, &dense.k));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.v, "v", 1, rank, &dense.v));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.out, "out", 1, rank, &dense.out));
  FMHA_RETURN_IF_ERROR(flatten_grid(a.lse, "lse", 2, rank, &dense.lse));  // [B, H, X...]
  dense.options = a.options;
  dense.workspace = a.workspace;
  call->grid = grid_of(a.neighborhood, shape);
  call->groups = dilation_groups(call->grid, shape, a.options, /*grads=*/nullptr);
  return Status::ok_status();
}

Status flatten_backward(const NeighborhoodBackwardParams& a, const detail::ProblemShape& shape,
                        FlattenedCall<AttentionBackwardParams>* call) {
  const int rank = shape.grid_rank;
  AttentionBackwardParams& dense = call->dense;
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
  dense.workspace = a.workspace;
  call->grid = grid_of(a.neighborhood, shape);
  call->groups = dilation_groups(call->grid, shape, a.options, &a.grads);
  return Status::ok_status();
}

// The largest scratch that one of a flattened call's dense calls takes (they run one after the
// other on one stream, so they share it); `bytes_of(params, shape, grid, &bytes)` sizes one.
template <typename DenseParams, typename GridViews, typename BytesOf>
Status largest_group_workspace(const FlattenedCall<DenseParams>& call,
                               const detail::ProblemShape& shape, GridViews grid_views,
                               BytesOf bytes_of, std::size_t* bytes) {
  *bytes = 0;
  return run_dilation_groups(call.groups, call.dense, shape, call.grid, grid_views,
                             [&](const DenseParams& p, const detail::ProblemShape& s,
                                 const NeighborhoodGrid& g, bool) {
                               std::size_t group_bytes = 0;
                               FMHA_RETURN_IF_ERROR(bytes_of(p, s, g, &group_bytes));
                               *bytes = std::max(*bytes, group_bytes);
                               return Status::ok_status();
                             });
}

// What a forward call and its size query share: the checks, then the flattening; `*empty`: the
// call computes nothing (no launch, no scratch).
Status prepare_forward(const NeighborhoodForwardParams& a, const detail::ProblemShape& shape,
                       FlattenedCall<AttentionForwardParams>* call, bool* empty) {
  FMHA_RETURN_IF_ERROR(check_forward_dtype(a.q.dtype));
  *empty = shape.seqlen_q == 0 || shape.batch == 0 || shape.heads == 0;
  if (*empty) return Status::ok_status();
  FMHA_RETURN_IF_ERROR(check_token_count(shape));
  return flatten_forward(a, shape, call);
}

}  // namespace

Status run(const NeighborhoodForwardParams& a, const detail::ProblemShape& shape, void* stream) {
  FlattenedCall<AttentionForwardParams> call;
  bool empty = false;
  FMHA_RETURN_IF_ERROR(prepare_forward(a, shape, &call, &empty));
  if (empty) return Status::ok_status();
  return run_dilation_groups(
      call.groups, call.dense, shape, call.grid, ForwardGridViews{},
      [stream](const AttentionForwardParams& p, const detail::ProblemShape& s,
               const NeighborhoodGrid& g, bool) { return run_dense_forward(p, s, g, stream); });
}

Status workspace_size(const NeighborhoodForwardParams& a, const detail::ProblemShape& shape,
                      std::size_t* bytes) {
  *bytes = 0;
  FlattenedCall<AttentionForwardParams> call;
  bool empty = false;
  FMHA_RETURN_IF_ERROR(prepare_forward(a, shape, &call, &empty));
  if (empty) return Status::ok_status();
  return largest_group_workspace(call, shape, ForwardGridViews{}, dense_forward_workspace_bytes,
                                 bytes);
}

// The backward is the dense backward on the flattened views, with the grid's mask policy.
Status run(const NeighborhoodBackwardParams& a, const detail::ProblemShape& shape, void* stream) {
  FMHA_RETURN_IF_ERROR(check_token_count(shape));
  FlattenedCall<AttentionBackwardParams> call;
  FMHA_RETURN_IF_ERROR(flatten_backward(a, shape, &call));
  // Group launches after the first add their rows' dsinks to the earlier ones' (the same order
  // every run: deterministic sums).
  return run_dilation_groups(
      call.groups, call.dense, shape, call.grid, BackwardGridViews{},
      [stream](const AttentionBackwardParams& p, const detail::ProblemShape& s,
               const NeighborhoodGrid& g, bool first) {
        return run_dense_backward(p, s, g, stream, /*accumulate_dsinks=*/!first);
      });
}

Status workspace_size(const NeighborhoodBackwardParams& a, const detail::ProblemShape& shape,
                      std::size_t* bytes) {
  *bytes = 0;
  FMHA_RETURN_IF_ERROR(check_token_count(shape));
  FlattenedCall<AttentionBackwardParams> call;
  FMHA_RETURN_IF_ERROR(flatten_backward(a, shape, &call));
  return largest_group_workspace(call, shape, BackwardGridViews{},
                                 dense_backward_workspace_bytes, bytes);
}

}  // namespace fmha::cuda
