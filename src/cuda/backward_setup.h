// The backward's entry into its kernels for a layout that is dense attention underneath:
// neighborhood attention (neighborhood.cu) flattens its grid into one token dimension and runs
// the dense backward with its grid's mask policy. Defined in backward.cu.
#pragma once

#include <cstddef>

#include "api/problem.h"
#include "cuda/common/forward_params.h"
#include "fmha/params.h"
#include "fmha/status.h"

namespace fmha::cuda {

// The dense backward of `a` (q [B, L, H, D], lse [B, H, L], ...) under the neighborhood mask of
// `grid` (rank 0: no neighborhood mask, plain dense attention). With `accumulate_dsinks` the sink
// gradient of these rows is added to grads.dsinks instead of written (a problem run in parts).
// It runs in a.workspace's scratch memory; dense_backward_workspace_bytes gives the bytes it takes.
Status run_dense_backward(const AttentionBackwardParams& a, const detail::ProblemShape& shape,
                          const NeighborhoodGrid& grid, void* stream,
                          bool accumulate_dsinks = false);
Status dense_backward_workspace_bytes(const AttentionBackwardParams& a,
                                      const detail::ProblemShape& shape,
                                      const NeighborhoodGrid& grid, std::size_t* bytes);

}  // namespace fmha::cuda
