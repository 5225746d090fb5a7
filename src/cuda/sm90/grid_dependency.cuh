// Programmatic dependent launch between the sm90 split backward's two kernels. The dK/dV kernel
// and the dQ kernel after it in the stream read nothing of each other's outputs (both read the
// inputs and the preprocess's row statistics; dbias and drel are the dQ kernel's), so the dQ
// kernel may start before the dK/dV kernel has finished: its blocks then take the SMs that the
// dK/dV kernel's last wave leaves idle, instead of the GPU draining between the two
// (BackwardParams::dq_overlaps_dkdv, launch_bwd.cuh).
#pragma once

#include <cuda_runtime.h>

namespace fmha::cuda::sm90 {

// In the kernel before: the next kernel's blocks may be scheduled once every block of this grid
// has called this (or exited); called first thing, as the dQ kernel needs none of this one's
// outputs. Without the overlap (no launch attribute on the next kernel) it does nothing.
__device__ __forceinline__ void let_next_kernel_start() {
  cudaTriggerProgrammaticLaunchCompletion();
}

// In the kernel after: an object whose destruction, on every way out of a block, waits until the
// kernel before has completed and its writes are visible. So this grid completes only after that
// one, and what the stream runs next (the dbias conversion, the caller's kernels) finds dK and dV
// written, as with plain stream order. The wait returns at once where there is nothing to wait
// for (a launch without the overlap). A dQ block that finishes while dK/dV blocks still run holds
// its SM until they end; they all started before it, so that is at most one dK/dV block's time.
struct CompleteAfterPreviousKernel {
  __device__ ~CompleteAfterPreviousKernel() { cudaGridDependencySynchronize(); }
};

}  // namespace fmha::cuda::sm90
