#include <array>
#include <mutex>

#include "cuda/workspace_pool.h"

namespace fmha::cuda {
namespace {

constexpr int kMaxDevices = 64;

// One pool per device, made on first use and kept for the process (never destroyed: its memory goes
// with the context at exit). nullptr after a failed attempt: the default pool then serves.
cudaMemPool_t pool_of(int device) {
  static std::mutex mutex;
  static std::array<cudaMemPool_t, kMaxDevices> pools{};
  static std::array<bool, kMaxDevices> tried{};
  if (device < 0 || device >= kMaxDevices) return nullptr;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!tried[device]) {
    tried[device] = true;
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    if (cudaMemPoolCreate(&pool, &props) == cudaSuccess) {
      std::uint64_t threshold = kWorkspaceCacheBytes;
      if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold) ==
          cudaSuccess) {
        pools[device] = pool;
      } else {
        cudaMemPoolDestroy(pool);
      }
    }
    // A failed attempt's error must not surface at the caller's next launch check.
    if (pools[device] == nullptr) cudaGetLastError();
  }
  return pools[device];
}

}  // namespace

cudaError_t workspace_malloc_async(void** ptr, std::size_t bytes, int device, cudaStream_t stream) {
  cudaMemPool_t pool = pool_of(device);
  const cudaError_t e = pool == nullptr ? cudaMallocAsync(ptr, bytes, stream)
                                        : cudaMallocFromPoolAsync(ptr, bytes, pool, stream);
  // A failed allocation (out of memory) is reported by the caller's Status; its error must not
  // stay behind for the next launch check to find (that call would fail for nothing).
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

}  // namespace fmha::cuda
