// Device copies of host test tensors with the host's strides: upload, download, and the views fmha
// receives. Header-only, for the CUDA tests that do not go through cuda_forward_case.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "test_util.h"

namespace fmha_cuda_test {

// Bytes spanned by a strided view (its storage, as HostTensor allocates it).
inline std::size_t storage_bytes(const fmha::TensorView& v) {
  std::int64_t elements = 1;
  for (int d = 0; d < v.rank; ++d) {
    const auto dim = static_cast<std::size_t>(d);
    if (v.shape[dim] == 0) return 0;
    elements += (v.shape[dim] - 1) * v.stride[dim];
  }
  return static_cast<std::size_t>(elements) * fmha::element_size(v.dtype);
}

// Host-to-device copy and fill that have landed when they return. A cudaMemcpy from pageable
// host memory may return once the bytes are staged, before the DMA lands, and cudaMemset is
// asynchronous; the library's calls in these tests run on streams that do not synchronise with the
// legacy default stream (TestStream's), so without the device synchronisation a kernel could read
// the old contents (seen as a rare wrong result of the last, smallest upload).
inline cudaError_t copy_to_device(void* dst, const void* src, std::size_t bytes) {
  const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}
inline cudaError_t fill_device(void* dst, int byte, std::size_t bytes) {
  const cudaError_t e = cudaMemset(dst, byte, bytes);
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

// Owns the device buffers; every copy keeps the host tensor's strides, so padding, permuted and
// broadcast layouts reach the kernels unchanged. Copies are made at once, or queued on the stream
// given at construction.
class DeviceCopies {
 public:
  DeviceCopies() = default;
  explicit DeviceCopies(void* stream) : stream_(static_cast<cudaStream_t>(stream)) {}
  DeviceCopies(const DeviceCopies&) = delete;
  DeviceCopies& operator=(const DeviceCopies&) = delete;
  ~DeviceCopies() { release(); }

  // The device view of `h` on the current device (rank 0 when h is not defined); gtest failure
  // when CUDA fails. The buffer is kept until release().
  fmha::TensorView upload(fmha_test::HostTensor& h) {
    if (!h.defined()) return {};
    fmha::TensorView v = h.view();
    const std::size_t bytes = storage_bytes(v);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<std::size_t>(bytes, 16));
    EXPECT_EQ(e, cudaSuccess) << "cudaMalloc: " << cudaGetErrorString(e);
    if (e != cudaSuccess) return {};
    allocations_.push_back(p);
    if (bytes > 0) {
      if (stream_ == nullptr) {
        const cudaError_t c = copy_to_device(p, v.data, bytes);
        EXPECT_EQ(c, cudaSuccess) << "cudaMemcpy: " << cudaGetErrorString(c);
      } else {
        const cudaError_t c = cudaMemcpyAsync(p, v.data, bytes, cudaMemcpyHostToDevice, stream_);
        EXPECT_EQ(c, cudaSuccess) << "cudaMemcpyAsync: " << cudaGetErrorString(c);
      }
    }
    int device = 0;
    cudaGetDevice(&device);
    v.data = p;
    v.device = fmha::Device::cuda(device);
    return v;
  }

  // Copies the storage of device view `v` back into `h` (which it was uploaded from): at once, or
  // queued on `stream` (after the work queued there) and waited for.
  static void download(fmha_test::HostTensor& h, const fmha::TensorView& v,
                       void* stream = nullptr) {
    const std::size_t bytes = storage_bytes(v);
    if (bytes == 0) return;
    if (stream == nullptr) {
      const cudaError_t e = cudaMemcpy(h.view().data, v.data, bytes, cudaMemcpyDeviceToHost);
      EXPECT_EQ(e, cudaSuccess) << "cudaMemcpy: " << cudaGetErrorString(e);
      return;
    }
    const auto s = static_cast<cudaStream_t>(stream);
    const cudaError_t c = cudaMemcpyAsync(h.view().data, v.data, bytes, cudaMemcpyDeviceToHost, s);
    EXPECT_EQ(c, cudaSuccess) << "cudaMemcpyAsync: " << cudaGetErrorString(c);
    const cudaError_t e = cudaStreamSynchronize(s);
    EXPECT_EQ(e, cudaSuccess) << "cudaStreamSynchronize: " << cudaGetErrorString(e);
  }

  // Frees every buffer, once the copies queued on the stream have finished.
  void release() {
    if (stream_ != nullptr && !allocations_.empty()) cudaStreamSynchronize(stream_);
    for (void* p : allocations_) cudaFree(p);
    allocations_.clear();
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
};

// A stream of its own that does not synchronise with the legacy default stream.
class TestStream {
 public:
  TestStream() { cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  ~TestStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void* get() const { return stream_; }
  cudaError_t sync() const { return cudaStreamSynchronize(stream_); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace fmha_cuda_test
