// A kernel launch that may start while the kernel before it in the stream still runs
// (programmatic dependent launch, sm90 and newer). The launched kernel must wait for its
// predecessor before it reads what that one writes (griddepcontrol.wait: sm90/grid_dependency.cuh),
// and the predecessor may let it start early (griddepcontrol.launch_dependents).
#pragma once

#include <cuda_runtime.h>

namespace fmha::cuda {

// Launches `kernel` on `stream` with `args`. With `overlap_previous` it asks for a programmatic
// dependent launch first; a runtime or driver that refuses it (say, a stream capture that cannot
// hold it) gets the plain launch, whose own error, if any, is returned.
template <typename... KernelParams, typename... Args>
cudaError_t launch_maybe_overlapped(void (*kernel)(KernelParams...), dim3 grid, dim3 block,
                                    int smem, cudaStream_t stream, bool overlap_previous,
                                    const Args&... args) {
  if (overlap_previous) {
    cudaLaunchAttribute overlap[1] = {};
    overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = static_cast<std::size_t>(smem);
    config.stream = stream;
    config.attrs = overlap;
    config.numAttrs = 1;
    if (cudaLaunchKernelEx(&config, kernel, args...) == cudaSuccess) return cudaSuccess;
    (void)cudaGetLastError();  // refused: clear it and launch plainly
  }
  kernel<<<grid, block, smem, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace fmha::cuda
