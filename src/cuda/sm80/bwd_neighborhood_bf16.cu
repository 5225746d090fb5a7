// sm80 backward instantiations of neighborhood attention, bf16: every head-dim bucket of
// tile_sizes.h (a file of its own so that it compiles in parallel with the other policies).
#include "cuda/sm80/launch_bwd.cuh"

namespace fmha::cuda::sm80 {
#define FMHA_INSTANTIATE(D)                                                                       \
  template Status launch_backward_dkdv<__nv_bfloat16, D, PolicyNeighborhood>(                     \
      const BackwardParams&, cudaStream_t);                                                       \
  template Status launch_backward_dq<__nv_bfloat16, D, PolicyNeighborhood>(const BackwardParams&, \
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
}  // namespace fmha::cuda::sm80
