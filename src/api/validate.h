// Argument validation (SPEC §14): every entry point is checked here before any backend runs.
// Messages name the argument, the value received and what is accepted, and start with "fmha: ".
#pragma once

#include "api/problem.h"
#include "fmha/params.h"
#include "fmha/status.h"

namespace fmha::detail {

Status validate(const AttentionForwardParams& p, ProblemShape* shape);
Status validate(const AttentionBackwardParams& p, ProblemShape* shape);
Status validate(const VarlenForwardParams& p, ProblemShape* shape);
Status validate(const VarlenBackwardParams& p, ProblemShape* shape);
Status validate(const NeighborhoodForwardParams& p, ProblemShape* shape);
Status validate(const NeighborhoodBackwardParams& p, ProblemShape* shape);
Status validate(const MergeForwardParams& p);
Status validate(const MergeBackwardParams& p);

}  // namespace fmha::detail
