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

// The varlen offsets `cu` ([B + 1] int32; `name` in messages) of a tensor `rows_of` of `rows`
// rows, each sequence at most `max_seqlen` (`max_name`) long. Reads CPU offsets only (validate
// calls it on CPU ones; the CUDA backend on a host copy when asked): ok for any other device.
Status check_offsets(const TensorView& cu, const char* name, std::int64_t rows, const char* rows_of,
                     std::int64_t max_seqlen, const char* max_name);

}  // namespace fmha::detail
