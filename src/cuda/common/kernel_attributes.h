// Host-side kernel attributes that a launch needs but that do not change between calls: a
// kernel's dynamic shared-memory limit, the device's opt-in maximum, SM count and compute
// capability. Each is asked of the
// driver once per device and remembered, so that a serving loop's launches make no
// cudaFuncSetAttribute or cudaDeviceGetAttribute calls after the first.
//
// Both caches assume the library's own use of the device: a cudaDeviceReset by the application
// drops the limits raised so far, and the next launch that needs one fails with the launch error.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <type_traits>

namespace fmha::cuda {

// Devices whose attributes are remembered; a device index beyond them (or a negative one) asks the
// driver on every call.
inline constexpr int kMaxCachedDevices = 64;

// Shared memory a block may opt into on `device` (cudaDevAttrMaxSharedMemoryPerBlockOptin), asked
// once per device. Two threads may both ask the first time; they store the same value.
namespace attribute_cache {
// A device attribute (>= 0), asked of the driver once per device (kAttribute's own table, which
// holds the value + 1: 0 is not asked yet).
template <cudaDeviceAttr kAttribute>
cudaError_t cached_device_attribute(int device, int* value) {
  static std::atomic<int> known[kMaxCachedDevices] = {};
  const bool cached = device >= 0 && device < kMaxCachedDevices;
  if (cached) {
    const int stored = known[device].load(std::memory_order_relaxed);
    if (stored > 0) {
      *value = stored - 1;
      return cudaSuccess;
    }
  }
  const cudaError_t e = cudaDeviceGetAttribute(value, kAttribute, device);
  if (e == cudaSuccess && cached && *value >= 0) {
    known[device].store(*value + 1, std::memory_order_relaxed);
  }
  return e;
}
}  // namespace attribute_cache

inline cudaError_t smem_optin_limit(int device, int* bytes) {
  return attribute_cache::cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device,
                                                                                     bytes);
}

// The SMs of `device` (cudaDevAttrMultiProcessorCount), asked once per device.
inline cudaError_t sm_count(int device, int* sms) {
  return attribute_cache::cached_device_attribute<cudaDevAttrMultiProcessorCount>(device, sms);
}

// The compute capability of `device` as major * 10 + minor, asked once per device.
inline cudaError_t compute_capability(int device, int* arch) {
  int major = 0, minor = 0;
  using attribute_cache::cached_device_attribute;
  cudaError_t e = cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(device, &major);
  if (e == cudaSuccess) {
    e = cached_device_attribute<cudaDevAttrComputeCapabilityMinor>(device, &minor);
  }
  *arch = major * 10 + minor;
  return e;
}

namespace attribute_cache {
// Serializes the slow path of allow_dynamic_smem (all kernels): cudaFuncSetAttribute sets a limit
// rather than raising it, so two threads raising the same kernel to different sizes at once could
// otherwise leave the smaller in force while the larger is remembered.
inline std::mutex& dynamic_smem_mutex() {
  static std::mutex mutex;
  return mutex;
}
}  // namespace attribute_cache

// Raises kKernel's dynamic shared-memory limit on the current device to at least `bytes`. Each
// instantiation remembers, per device, the largest limit it has set: a request within it returns
// at once; a larger one (the same kernel may launch with more, say with staged bias tiles) sets
// the larger limit, under a mutex that keeps the remembered value the one in force. The kernel is
// a template argument so that the table is per kernel without a lookup.
template <auto kKernel>
cudaError_t allow_dynamic_smem(int bytes) {
  static std::atomic<int> granted[kMaxCachedDevices] = {};
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  if (device < 0 || device >= kMaxCachedDevices) {
    return cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  }
  std::atomic<int>& limit = granted[device];
  if (bytes <= limit.load(std::memory_order_acquire)) return cudaSuccess;
  std::lock_guard<std::mutex> lock(attribute_cache::dynamic_smem_mutex());
  if (bytes <= limit.load(std::memory_order_relaxed)) return cudaSuccess;  // raised meanwhile
  e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) limit.store(bytes, std::memory_order_release);
  return e;
}

// A kernel as a type: for a launcher that picks one of several kernels at run time and passes the
// choice on as a template argument (through a generic lambda's parameter).
template <auto kKernel>
using KernelConstant = std::integral_constant<decltype(kKernel), kKernel>;

}  // namespace fmha::cuda
