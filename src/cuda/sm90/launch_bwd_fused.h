// Launch of the warp-specialized fused sm90 backward (mainloop_bwd_fused.cuh) for one
// compile-time variant. Declared here for the dispatch; defined in launch_bwd_fused.cuh and
// instantiated in generated/bwd_fused_*.cu (sm_90a only).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/backward_params.h"
#include "fmha/status.h"

namespace fmha::cuda::sm90 {

// The main kernel (dK, dV, and dQ added to p.dq_accum, zeroed by the caller and laid out as
// set_dq_accumulator_strides says) and the conversion of the accumulator into dq; asynchronous,
// launch errors only.
template <typename T, int kD, typename Policy>
Status launch_backward_fused(const BackwardParams& p, cudaStream_t stream);

}  // namespace fmha::cuda::sm90
