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

#include <cstddef>
#include <string>

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
    const cudaError_t e = fmha_cuda_test::fill_device(dst, byte, bytes);
    EXPECT_EQ(e, cudaSuccess) << "cudaMemset: " << cudaGetErrorString(e);
  }
  void write(unsigned char* dst, const void* src, std::size_t bytes) override {
    const cudaError_t e = fmha_cuda_test::copy_to_device(dst, src, bytes);
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
  fmha::TensorView upload(fmha_test::HostTensor& h) override { return copies_.upload(h); }
  void download(fmha_test::HostTensor& h, const fmha::TensorView& v) override {
    DeviceCopies::download(h, v, stream_.get());
  }
  void* stream() override { return stream_.get(); }
  fmha::Status synchronize() override {
    const cudaError_t e = stream_.sync();
    if (e == cudaSuccess) return fmha::Status::ok_status();
    return fmha::Status::backend_error(std::string("fmha test: cudaStreamSynchronize: ") +
                                       cudaGetErrorString(e));
  }
  void release() override { copies_.release(); }

 private:
  TestStream stream_;  // destroyed after the copies, which wait for it
  DeviceCopies copies_{stream_.get()};
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

// Both regressions below: a case with sinks and dlse, so that gradients sum over the empty
// dimension beside dsinks.
fmha_test::AttentionCase sinks_and_dlse_case(fmha::DType dtype, std::int64_t kv_heads,
                                              std::int64_t head_dim, std::int64_t value_dim) {
  fmha_test::AttentionCase c;
  c.dtype = dtype;
  c.batch = 3;
  c.heads = 6;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.value_dim = value_dim;
  c.sinks = true;
  c.dlse = true;
  return c;
}

// The draw that found it (seed 20261456, D 11; here D 40 / 64, which run in bucket 64, the one every
// build of the sm90 kernels keeps): no keys, and a bias broadcast over Lk by stride 0, so
// its gradient has a stride-0 dimension of size 0. The backward took that dimension as broadcast
// (size 1) and wrote 180 gradient values into a tensor with no element, over dsinks (compute-
// sanitizer memcheck: invalid writes in the conversion kernel; dsinks read 0, not -8.1).
TEST(CudaFuzz, EmptyKeysWithStrideZeroBiasGradient) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present";
  CudaCaseDevice device;
  for (fmha::DType dtype : {fmha::DType::kFloat32, fmha::DType::kBFloat16}) {
    const std::int64_t dim = dtype == fmha::DType::kFloat32 ? 40 : 64;  // the draw: D 11, fp32
    fmha_test::AttentionCase c = sinks_and_dlse_case(dtype, 3, dim, dim);
    c.seqlen_q = 10;
    c.seqlen_k = 0;
    c.bias = {.given = true, .broadcast = {false, false, false, true}, .zero_stride = true};
    fmha_test::check_case(c, 20261456, &device);
  }
}

// The draws that found it (seeds 1992 and 30000084): rel-pos whose gradients have a size-1
// dimension over an empty problem dimension (no query, or no batch), so they sum over nothing and
// must be zeros. The backward left them unwritten (the NaN poison came back).
TEST(CudaFuzz, RelPosGradientsOverNoRows) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present";
  CudaCaseDevice device;
  for (fmha::DType dtype : {fmha::DType::kFloat32, fmha::DType::kBFloat16}) {
    fmha_test::AttentionCase c = sinks_and_dlse_case(dtype, 2, 16, 24);
    c.seqlen_q = 0;  // the first draw: no query, rel-pos broadcast over Lq by a size-1 dimension
    c.seqlen_k = 7;
    c.rel_hk = 1;
    c.rel_broadcast = {false, false, true};
    fmha_test::check_case(c, 1992, &device);
    c.batch = 0;  // the second: no batch, rel-pos broadcast over B
    c.seqlen_q = 3;
    c.seqlen_k = 4;
    c.rel_hk = 2;
    c.rel_broadcast = {true, false, false};
    fmha_test::check_case(c, 30000084, &device);
  }
}

}  // namespace
}  // namespace fmha_cuda_test
