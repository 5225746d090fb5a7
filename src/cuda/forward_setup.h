// Filling ForwardParams from validated views, shared by the forward entry points (forward.cu:
// dense and varlen; neighborhood.cu, which runs the dense forward on flattened views). Defined in
// forward.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "api/problem.h"
#include "cuda/common/forward_params.h"
#include "fmha/params.h"
#include "fmha/status.h"

namespace fmha::cuda {

// CUDA's limit on gridDim.y and gridDim.z: the kernels' grids take heads and batches there.
inline constexpr std::int64_t kMaxGridYZ = 65535;

// Sizes: batch, Lq, Lk, heads, the GQA group, D, Dv.
void fill_forward_sizes(const detail::ProblemShape& shape, ForwardParams* p);
// Scale, softcap, causal / window, bias, rel-pos, sinks, extra keys.
void fill_forward_options(const AttentionOptions& o, const detail::ProblemShape& shape,
                          ForwardParams* p);
// Elements of a 16-byte chunk: 8 of a 16-bit dtype, 4 floats.
std::int64_t chunk_elements(DType dtype);
// Whether 16-byte vector access reaches the start of every (batch, row, head) row of `t`: the base
// pointer is 16-byte aligned and every stride but the last is a multiple of 16 bytes.
bool rows_aligned16(const TensorView& t);
// Whether tiles load and store with 16-byte vectors (call after fill_forward_options).
void fill_forward_alignment(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const AttentionOptions& o, ForwardParams* p);
// Neighborhood attention's mask (SPEC §6): a grid with one axis of more than one token and no
// dilation is a window of consecutive keys that shifts at the borders, and runs as the window
// mask on the dense kernels (range tiles, unmasked full tiles); any other grid keeps the
// neighborhood mask policy (token tiles). A grid of rank 0 (dense attention) changes nothing.
// Defined in neighborhood.cu.
void set_neighborhood_mask(const NeighborhoodGrid& grid, ForwardParams* p);
// The launch of a filled ForwardParams (`q`: the queries' view, for dtype and device): its
// scratch memory from `workspace`, then the dispatch; and the scratch bytes that takes.
Status launch_forward_kernel(const ForwardParams& p, const TensorView& q,
                             const Workspace& workspace, void* stream);
Status forward_workspace_bytes(const ForwardParams& p, const TensorView& q, std::size_t* bytes);
// The dense forward of `a` (q [B, L, H, D], lse [B, H, L]) under the neighborhood mask of `grid`
// (rank 0: no neighborhood mask, plain dense attention), as run_dense_backward (backward_setup.h),
// in a.workspace's scratch memory; and the bytes of it that call takes.
Status run_dense_forward(const AttentionForwardParams& a, const detail::ProblemShape& shape,
                         const NeighborhoodGrid& grid, void* stream);
Status dense_forward_workspace_bytes(const AttentionForwardParams& a,
                                     const detail::ProblemShape& shape,
                                     const NeighborhoodGrid& grid, std::size_t* bytes);

}  // namespace fmha::cuda
