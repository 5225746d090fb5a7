// Forward dispatch: turns the runtime dtype, head-dim bucket and policy of a filled ForwardParams
// into one compiled kernel variant.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/forward_params.h"
#include "fmha/status.h"
#include "fmha/tensor.h"

namespace fmha::cuda {

// ok for the dtypes the forward kernels take (fp32, fp16, bf16); otherwise not_supported, saying
// why.
Status check_forward_dtype(DType dtype);

// `dtype` is q's dtype (fp32, fp16 or bf16; anything else is refused with a message); `arch` the
// device's compute capability (major * 10 + minor): 90 runs the Hopper kernels for fp16/bf16
// where they exist, and for fp32 where fp32_planes_apply (built for sm_90a, and not turned off by
// FMHA_CUDA_KERNELS=sm80 in the environment); every other arch, and the rest of fp32, the sm80
// kernels.
Status dispatch_forward(const ForwardParams& p, DType dtype, int arch, cudaStream_t stream);

// Whether a device of compute capability `arch` runs the sm90 kernels in this build and process.
bool use_sm90_kernels(int arch);

// Whether the sm90 fp32 kernels (tf32 wgmma on split planes, forward and backward) take a problem
// of fp32 inputs: dense, head dims up to 64, no score modifiers, extra keys or neighborhood
// attention; masks, sinks and GQA run. The one rule of both directions.
bool fp32_planes_apply(const ForwardParams& p);

}  // namespace fmha::cuda
