// Placeholder until the validation lands: refuses everything.
#include "api/validate.h"

namespace fmha::detail {
namespace {
Status todo() { return Status::not_supported("fmha: validation not implemented yet"); }
}  // namespace
Status validate(const AttentionForwardParams&, ProblemShape*) { return todo(); }
Status validate(const AttentionBackwardParams&, ProblemShape*) { return todo(); }
Status validate(const VarlenForwardParams&, ProblemShape*) { return todo(); }
Status validate(const VarlenBackwardParams&, ProblemShape*) { return todo(); }
Status validate(const NeighborhoodForwardParams&, ProblemShape*) { return todo(); }
Status validate(const NeighborhoodBackwardParams&, ProblemShape*) { return todo(); }
Status validate(const MergeForwardParams&) { return todo(); }
Status validate(const MergeBackwardParams&) { return todo(); }
}  // namespace fmha::detail
