// The CUDA backend's entry points, called by dispatch after validation. Each returns
// Status::not_supported naming the feature when no kernel covers the call yet.
#pragma once

#include <cstddef>

#include "api/problem.h"
#include "fmha/params.h"
#include "fmha/status.h"

namespace fmha::cuda {

Status run(const AttentionForwardParams& p, const detail::ProblemShape& shape, void* stream);
Status run(const AttentionBackwardParams& p, const detail::ProblemShape& shape, void* stream);
Status run(const VarlenForwardParams& p, const detail::ProblemShape& shape, void* stream);
Status run(const VarlenBackwardParams& p, const detail::ProblemShape& shape, void* stream);
Status run(const NeighborhoodForwardParams& p, const detail::ProblemShape& shape, void* stream);
Status run(const NeighborhoodBackwardParams& p, const detail::ProblemShape& shape, void* stream);
Status run(const MergeForwardParams& p, void* stream);
Status run(const MergeBackwardParams& p, void* stream);

// The bytes of scratch memory run(p, shape, stream) takes at most (params.h's Workspace), planned as
// run() plans the call, launching nothing.
Status workspace_size(const AttentionForwardParams& p, const detail::ProblemShape& shape,
                      std::size_t* bytes);
Status workspace_size(const AttentionBackwardParams& p, const detail::ProblemShape& shape,
                      std::size_t* bytes);
Status workspace_size(const VarlenForwardParams& p, const detail::ProblemShape& shape,
                      std::size_t* bytes);
Status workspace_size(const VarlenBackwardParams& p, const detail::ProblemShape& shape,
                      std::size_t* bytes);
Status workspace_size(const NeighborhoodForwardParams& p, const detail::ProblemShape& shape,
                      std::size_t* bytes);
Status workspace_size(const NeighborhoodBackwardParams& p, const detail::ProblemShape& shape,
                      std::size_t* bytes);

}  // namespace fmha::cuda
