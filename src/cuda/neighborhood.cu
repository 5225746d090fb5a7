// CUDA backend entry point of the neighborhood attention forward (SPEC §6). The grid's tokens are
// flattened row-major, so NA runs as the forward kernel with the neighborhood mask policy
// (cuda/common/neighborhood_mask.cuh): q [B, X1, (X2, (X3)), H, D] becomes [B, N, H, D] with one
// token stride, lse [B, H, X...] becomes [B, H, N], and bias / rel-pos already index the flattened
// grid. The backward flattens the same way and runs the dense backward with the same mask policy
// (backward_setup.h).
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
  const int rank = shape.grid_rank;
  if (shape.seqlen_q == 0 || shape.batch == 0 || shape.heads == 0) return Status::ok_status();
  FMHA_RETURN_IF_ERROR(check_token_count(shape));
  ForwardParams p;
  fill_forward_sizes(shape, &p);
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.out = a.out.data;
  // Dims: 0 batch, 1 .. rank grid axes, rank + 1 heads.
  const int heads_dim = rank + 1;
  FMHA_RETURN_IF_ERROR(expect_token_stride(a.q, "q", 1, rank, &p.q_row_stride));
  FMHA_RETURN_IF_ERROR(expect_token_stride(a.k, "k", 1, rank, &p.k_row_stride));
  FMHA_RETURN_IF_ERROR(expect_token_stride(a.v, "v", 1, rank, &p.v_row_stride));
  FMHA_RETURN_IF_ERROR(expect_token_stride(a.out, "out", 1, rank, &p.out_row_stride));
  p.q_batch_stride = a.q.stride[0], p.q_head_stride = a.q.stride[heads_dim];
  p.k_batch_stride = a.k.stride[0], p.k_head_stride = a.k.stride[heads_dim];
  p.v_batch_stride = a.v.stride[0], p.v_head_stride = a.v.stride[heads_dim];
  p.out_batch_stride = a.out.stride[0], p.out_head_stride = a.out.stride[heads_dim];
  if (a.lse.defined()) {  // [B, H, X...]
    FMHA_RETURN_IF_ERROR(expect_token_stride(a.lse, "lse", 2, rank, &p.lse_row_stride));
    p.lse = static_cast<float*>(a.lse.data);
    p.lse_batch_stride = a.lse.stride[0];
    p.lse_head_stride = a.lse.stride[1];
  }
  fill_forward_options(a.options, shape, &p);
  set_neighborhood_mask(grid_of(a.neighborhood, shape), &p);
  fill_forward_alignment(a.q, a.k, a.v, a.out, a.options, &p);
  return launch_forward_kernel(p, a.q, stream);
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
  return run_dense_backward(dense, shape, grid_of(a.neighborhood, shape), stream);
}

}  // namespace fmha::cuda
