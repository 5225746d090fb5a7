// sm90 forward instantiations, bf16: every head-dim bucket, the dense policies (plain, window,
// general).
#include "cuda/sm90/launch_fwd.cuh"

namespace fmha::cuda::sm90 {
#define FMHA_INSTANTIATE(D)                                                             \
  template Status launch_forward<__nv_bfloat16, D, PolicyPlain>(const ForwardParams&,   \
                                                                cudaStream_t);          \
  template Status launch_forward<__nv_bfloat16, D, PolicyWindow>(const ForwardParams&,  \
                                                                 cudaStream_t);         \
  template Status launch_forward<__nv_bfloat16, D, PolicyGeneral>(const ForwardParams&, \
                                                                  cudaStream_t);
FMHA_INSTANTIATE(32)
FMHA_INSTANTIATE(64)
FMHA_INSTANTIATE(96)
FMHA_INSTANTIATE(128)
FMHA_INSTANTIATE(160)
FMHA_INSTANTIATE(192)
FMHA_INSTANTIATE(224)
FMHA_INSTANTIATE(256)
#undef FMHA_INSTANTIATE
}  // namespace fmha::cuda::sm90
