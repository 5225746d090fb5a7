// Launch of the sm90 fp32 backward (tf32 wgmma on split planes, mainloop_bwd_fp32.cuh): the
// planes pass, the dK/dV kernel and the dQ kernel. Declared here for the dispatch; defined in
// launch_bwd_fp32.cuh and instantiated in generated/bwd_planes_fp32_d064.cu (sm_90a only).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/backward_params.h"
#include "fmha/status.h"

namespace fmha::cuda::sm90 {

// Writes dq, dk and dv of `p` (T = float, head dims up to kD = 64, Policy PolicyPlain or
// PolicyWindow; the cases of dispatch_bwd.cu's use_sm90_fp32_backward) on `stream`, from the row
// statistics the preprocess left in p.delta / p.lse_log2. Asynchronous: checks launch errors only.
template <typename T, int kD, typename Policy>
Status launch_backward_fp32(const BackwardParams& p, cudaStream_t stream);

}  // namespace fmha::cuda::sm90
