// sm90 backward instantiations, bf16: head-dim buckets up to kBwdMaxHeadDim, the plain and
// causal/window policies (score modifiers and their gradients run the sm80 backward).
#include "cuda/sm90/launch_bwd.cuh"

namespace fmha::cuda::sm90 {
#define FMHA_INSTANTIATE(D, P)                                                                    \
  template Status launch_backward_dkdv<__nv_bfloat16, D, P>(const BackwardParams&, cudaStream_t); \
  template Status launch_backward_dq<__nv_bfloat16, D, P>(const BackwardParams&, cudaStream_t);
#define FMHA_INSTANTIATE_POLICIES(D) \
  FMHA_INSTANTIATE(D, PolicyPlain)   \
  FMHA_INSTANTIATE(D, PolicyWindow)
FMHA_INSTANTIATE_POLICIES(32)
FMHA_INSTANTIATE_POLICIES(64)
FMHA_INSTANTIATE_POLICIES(96)
FMHA_INSTANTIATE_POLICIES(128)
#undef FMHA_INSTANTIATE_POLICIES
#undef FMHA_INSTANTIATE
}  // namespace fmha::cuda::sm90
