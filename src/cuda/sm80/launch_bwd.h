// Launch of the sm80 backward kernels for one compile-time variant. Declared here for the
// dispatch; defined in launch_bwd.cuh and instantiated in generated/bwd_*.cu
// (scripts/gen_instantiations.py).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/backward_params.h"
#include "fmha/status.h"

namespace fmha::cuda::sm80 {

// dK/dV (and, when p.dq_accum is set, the fused dQ atomics) for dtype T, head-dim bucket kD and
// policy Policy. Asynchronous: checks launch errors only.
template <typename T, int kD, typename Policy>
Status launch_backward_dkdv(const BackwardParams& p, cudaStream_t stream);

// dQ of the split backward (writes p.dq). Asynchronous.
template <typename T, int kD, typename Policy>
Status launch_backward_dq(const BackwardParams& p, cudaStream_t stream);

}  // namespace fmha::cuda::sm80
