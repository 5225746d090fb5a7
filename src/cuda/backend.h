// The CUDA backend's entry points, called by dispatch after validation. Each returns
// Status::not_supported naming the feature when no kernel covers the call yet.
#pragma once

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

}  // namespace fmha::cuda
