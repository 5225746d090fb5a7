// Launches of the sm90 backward kernels for one compile-time variant. Declared here for the
// dispatch; defined in launch_bwd.cuh and instantiated in generated/bwd_*.cu (sm_90a only).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/backward_params.h"
#include "fmha/status.h"

namespace fmha::cuda::sm90 {

// dK/dV (the split backward's, or the fused one's with dQ when p.dq_accum is set), and the dQ
// kernel; asynchronous, launch errors only.
template <typename T, int kD, typename Policy>
Status launch_backward_dkdv(const BackwardParams& p, cudaStream_t stream);
template <typename T, int kD, typename Policy>
Status launch_backward_dq(const BackwardParams& p, cudaStream_t stream);

}  // namespace fmha::cuda::sm90
