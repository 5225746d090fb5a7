// Launch of the sm90 fp32 forward (tf32 wgmma on split planes, mainloop_fwd_fp32.cuh). Declared
// here for the dispatch; defined in launch_fwd_fp32.cuh and instantiated in
// generated/fwd_planes_fp32_d064.cu, compiled for sm_90a only.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/forward_params.h"
#include "fmha/status.h"

namespace fmha::cuda::sm90 {

// Runs the forward for `p` (T = float, head dims up to kD = 64, Policy PolicyPlain or
// PolicyWindow, dense batches without extra keys or score modifiers: dispatch_fwd.cu's
// fp32_planes_apply) on `stream`. Asynchronous: checks launch errors only.
template <typename T, int kD, typename Policy>
Status launch_forward_fp32(const ForwardParams& p, cudaStream_t stream);

}  // namespace fmha::cuda::sm90
