// The CPU reference: every SPEC feature, scalar, double accumulation. It is the oracle the GPU
// kernels are tested against, and it serves as the CPU backend. Inputs are validated before these
// are called; they never fail.
#pragma once

#include "api/problem.h"
#include "fmha/params.h"

namespace fmha::reference {

void run(const AttentionForwardParams& p, const detail::ProblemShape& shape);
void run(const AttentionBackwardParams& p, const detail::ProblemShape& shape);
void run(const VarlenForwardParams& p, const detail::ProblemShape& shape);
void run(const VarlenBackwardParams& p, const detail::ProblemShape& shape);
void run(const NeighborhoodForwardParams& p, const detail::ProblemShape& shape);
void run(const NeighborhoodBackwardParams& p, const detail::ProblemShape& shape);
void run(const MergeForwardParams& p);
void run(const MergeBackwardParams& p);

}  // namespace fmha::reference
