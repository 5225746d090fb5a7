// Entry points of the CUDA backend for which no kernel has landed yet: each refuses clearly.
// As kernels land, their entry points move out of this file (the forward lives in forward.cu,
// the backward in backward.cu, the neighborhood forward in neighborhood.cu, merging in
// merge.cu).
#include "cuda/backend.h"

namespace fmha::cuda {
namespace {
Status no_kernel(const char* what) {
  return Status::not_supported(std::string("fmha: the CUDA backend has no kernel for ") + what +
                               " yet; run it on CPU tensors (the reference backend)");
}
}  // namespace

Status run(const NeighborhoodBackwardParams&, const detail::ProblemShape&, void*) {
  return no_kernel("neighborhood attention backward");
}

}  // namespace fmha::cuda
