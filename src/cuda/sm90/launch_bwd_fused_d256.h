// Launch of the warp-specialized fused sm90 backward of head-dim bucket 256
// (mainloop_bwd_fused_d256.cuh), in translation units of its own (generated/bwd_fused256_*.cu):
// instantiated beside the other D 256 backward kernels it changed their code. Declared here for
// launch_bwd.cuh's fused and split forms (plain / window) and for dispatch_bwd.cu's split form of
// softcap alone (PolicySoftcap); defined in launch_bwd_fused_d256.cuh (sm_90a only).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/backward_params.h"
#include "fmha/status.h"

namespace fmha::cuda::sm90 {

// dK, dV, and dQ added to the by-column accumulator that the caller zeroed and later converts
// (the older fused form's, fused_dq.cuh), for dense batches with queries and keys whose q, k, v
// and dout tensor maps describe; kNotSupported, with nothing launched, elsewhere (the caller runs
// the other kernels).
// Without an accumulator (p.dq_accum null: the split form) dK and dV only.
template <typename T, int kD, typename Policy>
Status launch_backward_fused_d256(const BackwardParams& p, cudaStream_t stream);

}  // namespace fmha::cuda::sm90
