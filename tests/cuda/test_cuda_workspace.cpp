// Scratch memory on CUDA (fmha/params.h's Workspace): fmha::workspace_size, and the three places a
// call's scratch comes from (the caller's buffer, the caller's allocator, the library's pool).
// - What workspace_size reports is what a call asks its allocator for (the backward: exactly; the
//   forward: its tile counter or fp32 planes when it takes them), and the results from each place
//   are the same bits (deterministic calls).
// - A buffer one byte too small or misaligned, or an allocator that returns nothing: the call
//   refuses and writes nothing.
// - Results through the allocator and through an exact buffer pass the reference check.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda_backward_case.h"
#include "cuda_case_util.h"

namespace fmha_cuda_test {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present"

// Workspace::allocate that records every request and hands out cudaMalloc'd blocks, freed (after
// the device has drained) when it ends; with `fail`, returns nullptr.
class RecordingAllocator {
 public:
  RecordingAllocator() = default;
  RecordingAllocator(const RecordingAllocator&) = delete;
  RecordingAllocator& operator=(const RecordingAllocator&) = delete;
  ~RecordingAllocator() {
    cudaDeviceSynchronize();
    for (void* block : blocks_) cudaFree(block);
  }

  fmha::Workspace workspace() { return {.allocate = &allocate, .context = this}; }
  const std::vector<std::size_t>& requests() const { return requests_; }
  bool fail = false;

 private:
  static void* allocate(void* context, std::size_t bytes) {
    auto* self = static_cast<RecordingAllocator*>(context);
    self->requests_.push_back(bytes);
    if (self->fail) return nullptr;
    void* block = nullptr;
    if (cudaMalloc(&block, bytes) != cudaSuccess) return nullptr;
    self->blocks_.push_back(block);
    return block;
  }

  std::vector<std::size_t> requests_;
  std::vector<void*> blocks_;
};

// A device buffer of `bytes` (cudaMalloc: 256-byte aligned).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) {
    if (bytes > 0 && cudaMalloc(&data_, bytes) != cudaSuccess) data_ = nullptr;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    cudaDeviceSynchronize();
    cudaFree(data_);
  }
  char* get() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
};

bool sm90_kernels() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return false;
  }
  const char* kernels = std::getenv("FMHA_CUDA_KERNELS");
  return major == 9 && (kernels == nullptr || std::string(kernels) != "sm80");
}

// The gradients a backward writes, downloaded after a run from poisoned outputs.
struct Gradients {
  HostTensor dq, dk, dv;
};

void poison_gradients(Tensors& t, DeviceTensors& dev) {
  for (auto [h, d] : {std::pair{&t.dq, dev.views().dq}, std::pair{&t.dk, dev.views().dk},
                      std::pair{&t.dv, dev.views().dv}}) {
    h->poison();
    dev.reset(*h, d);
  }
}

Gradients download_gradients(Tensors& t, DeviceTensors& dev) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download(t.dq, dev.views().dq);
  dev.download(t.dk, dev.views().dk);
  dev.download(t.dv, dev.views().dv);
  return {t.dq, t.dk, t.dv};
}

// One backward case through every source of scratch memory: the pool, an allocator, a buffer of
// exactly workspace_size bytes; each must give the pool's bits (the case is deterministic), and
// the allocator must be asked once for exactly workspace_size bytes. Then the refusals.
void check_backward_sources(BackwardCase c, BackwardImpl impl, std::uint64_t seed) {
  SCOPED_TRACE("case: " + c.describe());
  c.options.deterministic = true;
  std::mt19937_64 rng(seed);
  Tensors t = make_tensors(c, c.dtype, DType::kFloat32, &rng);
  DeviceTensors dev;
  dev.upload(t);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(run_forward(c, dev.views()).ok());
  std::size_t bytes = 0;
  const fmha::Status sized = backward_workspace_size(c, dev.views(), impl, &bytes);
  ASSERT_TRUE(sized.ok()) << sized.message();
  ASSERT_GT(bytes, 0u) << "every backward keeps row statistics in its scratch";

  poison_gradients(t, dev);
  ASSERT_TRUE(run_backward(c, dev.views(), impl).ok());  // the pool
  const Gradients pooled = download_gradients(t, dev);

  {
    RecordingAllocator allocator;
    BackwardCase through = c;
    through.workspace = allocator.workspace();
    poison_gradients(t, dev);
    const fmha::Status s = run_backward(through, dev.views(), impl);
    ASSERT_TRUE(s.ok()) << s.message();
    const Gradients allocated = download_gradients(t, dev);
    EXPECT_EQ(allocator.requests(), std::vector<std::size_t>{bytes});
    EXPECT_TRUE(allocated.dq.bitwise_equal(pooled.dq));
    EXPECT_TRUE(allocated.dk.bitwise_equal(pooled.dk));
    EXPECT_TRUE(allocated.dv.bitwise_equal(pooled.dv));
  }

  DeviceBuffer buffer(bytes + 16);
  ASSERT_NE(buffer.get(), nullptr);
  BackwardCase given = c;
  given.workspace = {.data = buffer.get(), .bytes = bytes};
  poison_gradients(t, dev);
  fmha::Status s = run_backward(given, dev.views(), impl);
  ASSERT_TRUE(s.ok()) << s.message();
  const Gradients buffered = download_gradients(t, dev);
  EXPECT_TRUE(buffered.dq.bitwise_equal(pooled.dq));
  EXPECT_TRUE(buffered.dk.bitwise_equal(pooled.dk));
  EXPECT_TRUE(buffered.dv.bitwise_equal(pooled.dv));

  // Refusals: nothing written.
  const std::pair<fmha::Workspace, fmha::StatusCode> refused[] = {
      {{.data = buffer.get(), .bytes = bytes - 1}, fmha::StatusCode::kInvalidArgument},
      {{.data = buffer.get() + 8, .bytes = bytes}, fmha::StatusCode::kInvalidArgument},
  };
  for (const auto& [workspace, code] : refused) {
    BackwardCase bad = c;
    bad.workspace = workspace;
    poison_gradients(t, dev);
    s = run_backward(bad, dev.views(), impl);
    EXPECT_EQ(s.code(), code) << s.message();
    download_gradients(t, dev);
    EXPECT_TRUE(t.dq.poisoned() && t.dk.poisoned() && t.dv.poisoned())
        << "a refused call wrote a gradient: " << s.message();
  }
  RecordingAllocator failing;
  failing.fail = true;
  BackwardCase bad = c;
  bad.workspace = failing.workspace();
  poison_gradients(t, dev);
  s = run_backward(bad, dev.views(), impl);
  EXPECT_EQ(s.code(), fmha::StatusCode::kBackendError) << s.message();
  download_gradients(t, dev);
  EXPECT_TRUE(t.dq.poisoned() && t.dk.poisoned() && t.dv.poisoned())
      << "a call whose allocator failed wrote a gradient";
}

TEST(CudaWorkspace, BackwardFromEachSource) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 1;
  // The warp-specialized fused kernel (D 64 / 128), the split kernels (D 256 and asked for).
  check_backward_sources(shape_case(DType::kBFloat16, 239, 113, 64, 64, 4, 2, 2),
                         BackwardImpl::kAuto, seed++);
  check_backward_sources(shape_case(DType::kFloat16, 113, 239, 128, 128, 4, 1),
                         BackwardImpl::kSplit, seed++);
  check_backward_sources(shape_case(DType::kBFloat16, 100, 130, 256, 256, 2, 2),
                         BackwardImpl::kAuto, seed++);
  // fp32 (the sm90 fp32 kernels' operand planes after the statistics), causal.
  BackwardCase fp32 = shape_case(DType::kFloat32, 113, 200, 64, 64, 4, 2);
  fp32.options.causal = true;
  check_backward_sources(fp32, BackwardImpl::kAuto, seed++);
  // varlen with dbias (its accumulator after dQ's).
  BackwardCase varlen = shape_case(DType::kFloat16, 1, 1, 64, 64, 4, 2);
  varlen.varlen_q = {17, 130, 1};
  varlen.varlen_k = {40, 99, 200};
  check_backward_sources(varlen, BackwardImpl::kAuto, seed++);
  BackwardCase bias = shape_case(DType::kBFloat16, 77, 90, 64, 64, 2, 1, 2);
  bias.bias = true;
  bias.dbias = true;
  check_backward_sources(bias, BackwardImpl::kAuto, seed++);
}

// The reference check through the allocator and through an exact buffer.
TEST(CudaWorkspace, BackwardMatchesReferenceThroughCallerMemory) {
  SKIP_WITHOUT_GPU();
  RecordingAllocator allocator;
  BackwardCase c = shape_case(DType::kBFloat16, 239, 177, 128, 128, 4, 2, 2);
  c.options.causal = true;
  c.workspace = allocator.workspace();
  check_backward(c, 21);
  EXPECT_FALSE(allocator.requests().empty());

  // The largest scratch any of the case's calls takes, as one buffer for all of them.
  BackwardCase d = shape_case(DType::kFloat16, 150, 150, 96, 96, 4, 4);
  d.sinks = true;
  std::mt19937_64 rng(22);
  Tensors t = make_tensors(d, d.dtype, DType::kFloat32, &rng);
  DeviceTensors dev;
  dev.upload(t);
  if (::testing::Test::HasFatalFailure()) return;
  std::size_t largest = 0;
  for (BackwardImpl impl : d.impls) {
    std::size_t bytes = 0;
    ASSERT_TRUE(backward_workspace_size(d, dev.views(), impl, &bytes).ok());
    largest = std::max(largest, bytes);
  }
  std::size_t forward_bytes = 0;
  ASSERT_TRUE(forward_workspace_size(d, dev.views(), &forward_bytes).ok());
  largest = std::max(largest, forward_bytes);
  DeviceBuffer buffer(largest);
  d.workspace = {.data = buffer.get(), .bytes = largest};
  check_backward(d, 22);
}

// The forward's scratch on Hopper: a tile counter under a mask once there are more tiles than
// SMs, the fp32 kernels' planes; none for an unmasked 16-bit call.
TEST(CudaWorkspace, ForwardSizesAndSources) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 31;
  for (const bool fp32 : {false, true}) {
    BackwardCase c = shape_case(fp32 ? DType::kFloat32 : DType::kBFloat16, 1024, 1024, 64, 64,
                                16, 4, 2);
    c.options.causal = true;
    SCOPED_TRACE("case: " + c.describe());
    std::mt19937_64 rng(seed++);
    Tensors t = make_tensors(c, c.dtype, DType::kFloat32, &rng);
    DeviceTensors dev;
    dev.upload(t);
    if (::testing::Test::HasFatalFailure()) return;
    std::size_t bytes = 0;
    ASSERT_TRUE(forward_workspace_size(c, dev.views(), &bytes).ok());
    if (!sm90_kernels()) {
      EXPECT_EQ(bytes, 0u) << "the sm80 forward takes no scratch";
    } else if (fp32) {
      // Q [rows, 128] and K, V^T of 2 x 128 floats a key row, per (batch, head).
      EXPECT_EQ(bytes, (2 * 16 * 1024 * 128 + 2 * 2 * 4 * 1024 * 128) * sizeof(float));
    } else {
      EXPECT_EQ(bytes, 256u) << "the persistent kernel's tile counter";
    }
    BackwardCase plain = c;
    plain.options.causal = false;
    std::size_t plain_bytes = 0;
    ASSERT_TRUE(forward_workspace_size(plain, dev.views(), &plain_bytes).ok());
    if (!fp32) EXPECT_EQ(plain_bytes, 0u) << "an unmasked 16-bit forward takes no scratch";

    // The forward of `run_case` on poisoned out, downloaded after the device has drained.
    auto forward_poisoned = [&](const BackwardCase& run_case) {
      t.out.poison();
      dev.reset(t.out, dev.views().out);
      const fmha::Status s = run_forward(run_case, dev.views());
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      dev.download(t.out, dev.views().out);
      return s;
    };
    ASSERT_TRUE(forward_poisoned(c).ok());  // the pool
    const HostTensor pooled = t.out;

    RecordingAllocator allocator;
    BackwardCase through = c;
    through.workspace = allocator.workspace();
    ASSERT_TRUE(forward_poisoned(through).ok());
    EXPECT_TRUE(t.out.bitwise_equal(pooled));
    EXPECT_EQ(allocator.requests(),
              bytes == 0 ? std::vector<std::size_t>{} : std::vector<std::size_t>{bytes});

    if (bytes == 0) continue;
    DeviceBuffer buffer(bytes);
    BackwardCase given = c;
    given.workspace = {.data = buffer.get(), .bytes = bytes};
    ASSERT_TRUE(forward_poisoned(given).ok());
    EXPECT_TRUE(t.out.bitwise_equal(pooled));

    given.workspace.bytes = bytes - 1;
    const fmha::Status s = forward_poisoned(given);
    EXPECT_EQ(s.code(), fmha::StatusCode::kInvalidArgument) << s.message();
    EXPECT_TRUE(t.out.poisoned()) << "a refused forward wrote out";
  }
}

}  // namespace
}  // namespace fmha_cuda_test
