// Launch of the sm90 forward kernel for one compile-time variant. Declared here for the dispatch;
// defined in launch_fwd.cuh and instantiated in generated/fwd_*.cu (scripts/gen_instantiations.py),
// compiled for sm_90a only (FMHA_WITH_SM90 tells the dispatch they exist).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/forward_params.h"
#include "fmha/status.h"

namespace fmha::cuda::sm90 {

// Runs the forward for `p` on `stream` with dtype T (__half / __nv_bfloat16), head-dim bucket kD
// and policy Policy (cuda/common/forward_policies.cuh). Asynchronous: checks launch errors only.
template <typename T, int kD, typename Policy>
Status launch_forward(const ForwardParams& p, cudaStream_t stream);

}  // namespace fmha::cuda::sm90
