// The stream-ordered memory the CUDA backward takes for its workspace (row statistics, fp32
// accumulators of dQ, dbias, drel_h / drel_w): a pool of fmha's own per device that keeps up to
// kWorkspaceCacheBytes of freed memory for the next call. The device's default pool returns all of
// it to the system at every synchronisation (release threshold 0), so a backward after a sync
// re-mapped its whole workspace on the host while the GPU waited: about 0.5 ms of a 6 ms SAM-B
// rel-pos backward (200 MB of drel accumulators) on an H100, measured with the default pool's
// threshold raised. Memory above the threshold still goes back at each synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fmha::cuda {

inline constexpr std::uint64_t kWorkspaceCacheBytes = std::uint64_t{1} << 30;

// cudaMallocAsync from that pool on `device` (the current one); the default pool where a pool of
// its own cannot be made. Free with cudaFreeAsync. A failure (out of memory) is returned and not
// left as the runtime's last error.
cudaError_t workspace_malloc_async(void** ptr, std::size_t bytes, int device, cudaStream_t stream);

}  // namespace fmha::cuda
