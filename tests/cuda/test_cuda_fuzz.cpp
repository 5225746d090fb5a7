// Fuzzing the C++ API on CUDA tensors: the draws of tests/fuzz_api.cpp (the harness: fuzz_draws.h)
// with every tensor in device memory.
//   CudaFuzz.InvalidArguments    FMHA_FUZZ_INVALID draws (default 10000) on one device block:
//                                refused by check() and run() alike, naming the argument, and
//                                every byte of the block as it was. cu_seqlens values are not
//                                corrupted here: on CUDA the library does not read them (that
//                                would synchronise the device), so the caller owns them.
//   CudaFuzz.ValidAgainstOracle  FMHA_FUZZ_VALID draws (default 1000; float64 left out, which the
//                                CUDA backend refuses): inputs copied to the device with their
//                                strides, run on a stream of their own, outputs copied back and
//                                compared with the naive float64 oracle within SPEC §13. A valid
//                                call the backend refuses as not supported must say so in a
//                                message starting with "fmha: " and leave its outputs unwritten;
//                                such refusals are counted and printed, not failed.
// FMHA_FUZZ_SEED=<s> (default 1), FMHA_FUZZ_MAX_FAILURES, FMHA_FUZZ_VERBOSE as on the CPU; a
// failing draw prints the command that replays it alone.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "cuda/cuda_device_copy.h"
#include "cuda/cuda_forward_case.h"
#include "fuzz_draws.h"

namespace fmha_cuda_test {
namespace {

constexpr std::uint64_t kDefaultSeed = 1;
constexpr const char* kBinary = "build-gpu/tests/fmha_cuda_tests";

// The invalid draws' block of device memory.
class CudaMemory final : public fmha_fuzz::Memory {
 public:
  explicit CudaMemory(std::size_t bytes) : bytes_(bytes) {
    cudaGetDevice(&device_);
    if (cudaMalloc(&base_, bytes) != cudaSuccess) base_ = nullptr;
  }
  ~CudaMemory() override { cudaFree(base_); }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;

  bool ok() const { return base_ != nullptr; }
  fmha::Device device() const override { return fmha::Device::cuda(device_); }
  unsigned char* base() override { return static_cast<unsigned char*>(base_); }
  std::size_t capacity() const override { return bytes_; }
  void fill(unsigned char* dst, unsigned char byte, std::size_t bytes) override {
    const cudaError_t e = cudaMemset(dst, byte, bytes);
    EXPECT_EQ(e, cudaSuccess) << "cudaMemset: " << cudaGetErrorString(e);
  }
  void write(unsigned char* dst, const void* src, std::size_t bytes) override {
    const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    EXPECT_EQ(e, cudaSuccess) << "cudaMemcpy: " << cudaGetErrorString(e);
  }
  // After a device synchronisation: whatever a call queued has landed before the bytes are read.
  void read(void* dst, const unsigned char* src, std::size_t bytes) override {
    const cudaError_t s = cudaDeviceSynchronize();
    EXPECT_EQ(s, cudaSuccess) << "cudaDeviceSynchronize: " << cudaGetErrorString(s);
    const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    EXPECT_EQ(e, cudaSuccess) << "cudaMemcpy: " << cudaGetErrorString(e);
  }

 private:
  std::size_t bytes_;
  int device_ = 0;
  void* base_ = nullptr;
};

// Where the valid draws run: device copies of every tensor with its host strides, copied in and
// out on the stream the call runs on.
class CudaCaseDevice final : public fmha_test::CaseDevice {
 public:
  CudaCaseDevice() { cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  ~CudaCaseDevice() override {
    release();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  CudaCaseDevice(const CudaCaseDevice&) = delete;
  CudaCaseDevice& operator=(const CudaCaseDevice&) = delete;

  fmha::TensorView upload(fmha_test::HostTensor& h) override {
    if (!h.defined()) return {};
    fmha::TensorView v = h.view();
    const std::size_t bytes = storage_bytes(v);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<std::size_t>(bytes, 16));
    EXPECT_EQ(e, cudaSuccess) << "cudaMalloc: " << cudaGetErrorString(e);
    if (e != cudaSuccess) return {};
    allocations_.push_back(p);
    if (bytes > 0) {
      const cudaError_t c = cudaMemcpyAsync(p, v.data, bytes, cudaMemcpyHostToDevice, stream_);
      EXPECT_EQ(c, cudaSuccess) << "cudaMemcpyAsync: " << cudaGetErrorString(c);
    }
    int device = 0;
    cudaGetDevice(&device);
    v.data = p;
    v.device = fmha::Device::cuda(device);
    return v;
  }
  void download(fmha_test::HostTensor& h, const fmha::TensorView& v) override {
    const std::size_t bytes = storage_bytes(v);
    if (bytes == 0) return;
    const cudaError_t c =
        cudaMemcpyAsync(h.view().data, v.data, bytes, cudaMemcpyDeviceToHost, stream_);
    EXPECT_EQ(c, cudaSuccess) << "cudaMemcpyAsync: " << cudaGetErrorString(c);
    const cudaError_t e = cudaStreamSynchronize(stream_);
    EXPECT_EQ(e, cudaSuccess) << "cudaStreamSynchronize: " << cudaGetErrorString(e);
  }
  void* stream() override { return stream_; }
  fmha::Status synchronize() override {
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e == cudaSuccess) return fmha::Status::ok_status();
    return fmha::Status::backend_error(std::string("fmha test: cudaStreamSynchronize: ") +
                                       cudaGetErrorString(e));
  }
  void release() override {
    if (!allocations_.empty()) cudaStreamSynchronize(stream_);
    for (void* p : allocations_) cudaFree(p);
    allocations_.clear();
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
};

TEST(CudaFuzz, InvalidArguments) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present";
  CudaMemory memory(std::size_t{64} << 20);
  ASSERT_TRUE(memory.ok()) << "cudaMalloc of the fuzzing block failed";
  fmha_fuzz::fuzz_invalid(
      memory, fmha_fuzz::run_from_env("FMHA_FUZZ_INVALID", 10000, kDefaultSeed, kBinary));
}

TEST(CudaFuzz, ValidAgainstOracle) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present";
  CudaCaseDevice device;
  fmha_fuzz::ValidLimits limits;
  limits.float64 = false;
  fmha_fuzz::fuzz_valid(&device, limits,
                        fmha_fuzz::run_from_env("FMHA_FUZZ_VALID", 1000, kDefaultSeed, kBinary));
}

}  // namespace
}  // namespace fmha_cuda_test
