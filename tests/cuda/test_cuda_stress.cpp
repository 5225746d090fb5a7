// The CUDA backend under a serving process's conditions: several host threads calling it at once on
// streams of their own (the workspace pool, the kernels' attribute setup and the persistent
// forward's counters shared between them), forward + backward captured into a CUDA graph and
// replayed on new inputs, and out-of-memory reported as a Status with the device usable afterwards.
// Results are compared bit for bit with plain single-threaded runs (deterministic backward).
// scripts/gpu-check.sh runs these in its stress step (not in cuda-tests: the out-of-memory test
// fills the device).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_backward_case.h"
#include "cuda/cuda_device_copy.h"
#include "cuda/cuda_forward_case.h"
#include "test_util.h"

namespace fmha_cuda_test {
namespace {

using fmha_test::HostTensor;

#define SKIP_WITHOUT_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present"

struct Shape {
  DType dtype = DType::kFloat16;
  std::int64_t batch = 2, seqlen = 200, heads = 4, kv_heads = 2, head_dim = 64;
  bool causal = false;

  std::string describe() const {
    return std::string(fmha::to_string(dtype)) + " B" + std::to_string(batch) + " L" +
           std::to_string(seqlen) + " H" + std::to_string(heads) + "/" + std::to_string(kv_heads) +
           " D" + std::to_string(head_dim) + (causal ? " causal" : "");
  }
};

// One dense problem: host inputs (random, from `seed`), device copies on `stream`, and the host
// copies of out, lse, dq, dk, dv after a run.
class Problem {
 public:
  Problem(const Shape& s, std::uint64_t seed, void* stream) : shape_(s), copies_(stream) {
    std::mt19937_64 rng(seed);
    const std::vector<std::int64_t> qs{s.batch, s.seqlen, s.heads, s.head_dim};
    const std::vector<std::int64_t> ks{s.batch, s.seqlen, s.kv_heads, s.head_dim};
    q_ = HostTensor(s.dtype, qs), dout_ = HostTensor(s.dtype, qs), out_ = HostTensor(s.dtype, qs);
    k_ = HostTensor(s.dtype, ks), v_ = HostTensor(s.dtype, ks);
    dq_ = HostTensor(s.dtype, qs), dk_ = HostTensor(s.dtype, ks), dv_ = HostTensor(s.dtype, ks);
    lse_ = HostTensor(DType::kFloat32, {s.batch, s.heads, s.seqlen});
    for (HostTensor* x : {&q_, &k_, &v_, &dout_}) x->fill_uniform(rng, -1.0, 1.0);
    for (HostTensor* x : {&out_, &lse_, &dq_, &dk_, &dv_}) x->poison();
    for (HostTensor* x : {&q_, &k_, &v_, &dout_, &out_, &lse_, &dq_, &dk_, &dv_}) {
      views_.push_back(copies_.upload(*x));
    }
  }

  // Queues forward + deterministic backward on `stream`.
  fmha::Status enqueue(void* stream) const {
    fmha::AttentionOptions o;
    o.causal = shape_.causal;
    o.deterministic = true;
    fmha::AttentionForwardParams f;
    f.q = view(kQ), f.k = view(kK), f.v = view(kV), f.out = view(kOut), f.lse = view(kLse);
    f.options = o;
    FMHA_RETURN_IF_ERROR(fmha::run(f, stream));
    fmha::AttentionBackwardParams b;
    b.q = view(kQ), b.k = view(kK), b.v = view(kV), b.out = view(kOut), b.lse = view(kLse);
    b.dout = view(kDout);
    b.options = o;
    b.grads.dq = view(kDq), b.grads.dk = view(kDk), b.grads.dv = view(kDv);
    return fmha::run(b, stream);
  }

  // out, lse, dq, dk, dv copied back after the work queued on `stream`.
  std::vector<HostTensor> results(void* stream) {
    std::vector<HostTensor> r;
    for (int n : {kOut, kLse, kDq, kDk, kDv}) {
      DeviceCopies::download(host(n), views_[static_cast<std::size_t>(n)], stream);
      r.push_back(host(n));
    }
    return r;
  }

  // New inputs: q's values from `seed`, uploaded at once (outside any capture).
  void refill_q(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    q_.fill_uniform(rng, -1.0, 1.0);
    const fmha::TensorView& d = views_[kQ];
    ASSERT_EQ(copy_to_device(d.data, q_.view().data, storage_bytes(d)),
              cudaSuccess);
  }

 private:
  enum { kQ, kK, kV, kDout, kOut, kLse, kDq, kDk, kDv };
  const fmha::TensorView& view(int n) const { return views_[static_cast<std::size_t>(n)]; }
  HostTensor& host(int n) {
    HostTensor* all[] = {&q_, &k_, &v_, &dout_, &out_, &lse_, &dq_, &dk_, &dv_};
    return *all[n];
  }

  Shape shape_;
  DeviceCopies copies_;
  HostTensor q_, k_, v_, dout_, out_, lse_, dq_, dk_, dv_;
  std::vector<fmha::TensorView> views_;
};

const char* const kResultNames[] = {"out", "lse", "dq", "dk", "dv"};

void expect_same(const std::vector<HostTensor>& got, const std::vector<HostTensor>& expected,
                 const std::string& what) {
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t n = 0; n < got.size(); ++n) {
    EXPECT_TRUE(got[n].bitwise_equal(expected[n]))
        << what << ": " << kResultNames[n] << " differs from the single-threaded run";
  }
}

// A different problem a thread: lengths, GQA, head dims and masks vary.
Shape thread_shape(int t) {
  Shape s;
  s.seqlen = 97 + 61 * t;
  s.kv_heads = t % 2 == 0 ? 2 : 4;
  s.head_dim = t % 3 == 2 ? 128 : 64;
  s.causal = t % 2 == 1;
  s.dtype = t % 4 == 3 ? DType::kBFloat16 : DType::kFloat16;
  return s;
}

TEST(CudaStress, ThreadsOnTheirOwnStreams) {
  SKIP_WITHOUT_GPU();
  constexpr int kThreads = 6, kRounds = 8;
  // Expected: each problem alone, on the default stream.
  std::vector<std::vector<HostTensor>> expected(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    Problem p(thread_shape(t), 100 + t, nullptr);
    const fmha::Status s = p.enqueue(nullptr);
    ASSERT_TRUE(s.ok()) << thread_shape(t).describe() << ": " << s.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expected[static_cast<std::size_t>(t)] = p.results(nullptr);
  }
  // Every thread runs its problem kRounds times on its stream, all at once.
  std::vector<std::vector<HostTensor>> got(kThreads);
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      TestStream stream;
      Problem p(thread_shape(t), 100 + t, stream.get());
      for (int round = 0; round < kRounds; ++round) {
        const fmha::Status s = p.enqueue(stream.get());
        if (!s.ok()) {
          failures[static_cast<std::size_t>(t)] = s.message();
          return;
        }
      }
      const cudaError_t e = stream.sync();
      if (e != cudaSuccess) failures[static_cast<std::size_t>(t)] = cudaGetErrorString(e);
      got[static_cast<std::size_t>(t)] = p.results(stream.get());
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    const std::size_t i = static_cast<std::size_t>(t);
    ASSERT_EQ(failures[i], "") << thread_shape(t).describe();
    expect_same(got[i], expected[i], "thread " + std::to_string(t) + " " + thread_shape(t).describe());
  }
}

TEST(CudaStress, GraphCaptureAndReplay) {
  SKIP_WITHOUT_GPU();
  Shape shape;
  shape.causal = true;
  shape.seqlen = 333;
  // Expected: plain runs on two sets of inputs.
  std::vector<HostTensor> expected[2];
  for (int i = 0; i < 2; ++i) {
    Problem p(shape, 7, nullptr);
    p.refill_q(50 + i);
    ASSERT_TRUE(p.enqueue(nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expected[i] = p.results(nullptr);
  }
  // Capture forward + backward once (global mode: any call that is not capturable fails it).
  TestStream stream;
  const auto s = static_cast<cudaStream_t>(stream.get());
  Problem p(shape, 7, stream.get());
  ASSERT_EQ(stream.sync(), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  const fmha::Status captured = p.enqueue(stream.get());
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  ASSERT_TRUE(captured.ok()) << "during capture: " << captured.message();
  ASSERT_EQ(ended, cudaSuccess) << cudaGetErrorString(ended);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  // Replay on each set of inputs, twice each: the graph reads the buffers' current contents.
  for (int replay = 0; replay < 4; ++replay) {
    p.refill_q(50 + replay % 2);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(stream.sync(), cudaSuccess);
    expect_same(p.results(stream.get()), expected[replay % 2],
                "graph replay " + std::to_string(replay));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Takes device memory in decreasing chunks until almost none is left; frees it when destroyed.
class MemoryHog {
 public:
  MemoryHog() {
    for (std::size_t chunk = std::size_t{1} << 30; chunk >= (std::size_t{1} << 20); chunk /= 2) {
      void* p = nullptr;
      while (cudaMalloc(&p, chunk) == cudaSuccess) taken_.push_back(p);
    }
    cudaGetLastError();  // the last, failed cudaMalloc
  }
  MemoryHog(const MemoryHog&) = delete;
  MemoryHog& operator=(const MemoryHog&) = delete;
  ~MemoryHog() {
    for (void* p : taken_) cudaFree(p);
  }

 private:
  std::vector<void*> taken_;
};

TEST(CudaStress, OutOfMemoryIsAStatusAndTheDeviceStaysUsable) {
  SKIP_WITHOUT_GPU();
  // The fused backward's fp32 dQ accumulator (B H Lq D floats, 1.25 GiB here) is more than the
  // workspace pool keeps (1 GiB), so the call must allocate while nothing is left.
  constexpr std::int64_t kL = 32768, kH = 80, kD = 128;
  const std::size_t tensor_bytes = std::size_t{kL} * kH * kD * 2;
  if (free_device_memory() < 8 * tensor_bytes + (std::size_t{4} << 30)) {
    GTEST_SKIP() << "needs about 10 GiB of free device memory";
  }
  TestStream stream;
  // Device tensors of zeros (the numbers do not matter here): q k v out dout dq dk dv, and lse.
  std::vector<void*> buffers;
  std::vector<fmha::TensorView> v;
  for (int n = 0; n < 9; ++n) {
    const bool lse = n == 8;
    const std::size_t bytes = lse ? std::size_t{kL} * kH * 4 : tensor_bytes;
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    buffers.push_back(p);
    ASSERT_EQ(fill_device(p, 0, bytes), cudaSuccess);
    v.push_back(lse ? fmha::TensorView::contiguous(p, DType::kFloat32, {1, kH, kL},
                                                   fmha::Device::cuda(0))
                    : fmha::TensorView::contiguous(p, DType::kFloat16, {1, kL, kH, kD},
                                                   fmha::Device::cuda(0)));
  }
  fmha::AttentionBackwardParams b;
  b.q = v[0], b.k = v[1], b.v = v[2], b.out = v[3], b.dout = v[4], b.lse = v[8];
  b.grads.dq = v[5], b.grads.dk = v[6], b.grads.dv = v[7];
  b.backward_impl = fmha::BackwardImpl::kFused;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    MemoryHog hog;
    const fmha::Status s = fmha::run(b, stream.get());
    EXPECT_FALSE(s.ok()) << "the backward ran with no device memory left";
    if (!s.ok()) {
      EXPECT_EQ(s.code(), fmha::StatusCode::kBackendError) << s.message();
      EXPECT_NE(s.message().find("memory"), std::string::npos) << s.message();
    }
    EXPECT_EQ(stream.sync(), cudaSuccess);
  }
  // The memory is back: nothing of the failure is left to report, the same call runs, and so does
  // a checked problem (against the float64 CPU reference).
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const fmha::Status again = fmha::run(b, stream.get());
  EXPECT_TRUE(again.ok()) << again.message();
  EXPECT_EQ(stream.sync(), cudaSuccess);
  for (void* p : buffers) cudaFree(p);
  check_backward(shape_case(DType::kFloat16, 77, 91, 64, 64, 4, 2, 2), 5);
}

}  // namespace
}  // namespace fmha_cuda_test
