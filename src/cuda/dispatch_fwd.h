// Forward dispatch: turns the runtime dtype, head-dim bucket and policy of a filled ForwardParams
// into one compiled kernel variant.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/forward_params.h"
#include "fmha/status.h"
#include "fmha/tensor.h"

namespace fmha::cuda {

// ok for the dtypes the forward kernels take (fp16, bf16); otherwise not_supported, saying why.
Status check_forward_dtype(DType dtype);

// `dtype` is q's dtype (fp16 or bf16; anything else is refused with a message).
Status dispatch_forward(const ForwardParams& p, DType dtype, cudaStream_t stream);

}  // namespace fmha::cuda
