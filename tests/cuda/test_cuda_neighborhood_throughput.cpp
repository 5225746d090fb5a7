// Throughput of the CUDA neighborhood attention forward and backward next to the dense kernels on
// the same token count (issue 5's target: bf16 NA2d 64 x 64, kernel 13 x 13, D 128, useful TFLOP/s
// >= 25% of dense). Not a correctness test, so disabled by default; run with
//   fmha_cuda_tests --gtest_also_run_disabled_tests --gtest_filter='*Throughput*'
// FLOPs count visible (query, key) pairs only: 4 * D per pair forward (QK^T and PV), 10 * D
// backward (five products: S, dP, dV, dK, dQ). CUDA events, warm-up, median of 20 runs, random
// inputs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "cuda/cuda_device_copy.h"
#include "fmha/fmha.h"
#include "test_util.h"

namespace fmha_cuda_test {
namespace {

using fmha::DType;
using fmha_test::HostTensor;

// Median milliseconds of `fn` over `runs` runs after 3 warm-up runs.
double median_ms(const std::function<fmha::Status()>& fn, int runs = 20) {
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(fn().ok());
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms(static_cast<std::size_t>(runs));
  for (float& m : ms) {
    cudaEventRecord(start);
    const fmha::Status s = fn();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    EXPECT_TRUE(s.ok()) << s.message();
    cudaEventElapsedTime(&m, start, stop);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Problem {
  std::int64_t batch, heads, x1, x2, d;
  std::int64_t kernel;  // per axis, non-causal, no dilation: every query sees kernel^2 keys
};

void measure(const Problem& pr) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(7);
  const std::int64_t n = pr.x1 * pr.x2;
  auto make = [&](std::vector<std::int64_t> shape) {
    HostTensor t(DType::kBFloat16, std::move(shape));
    t.fill_uniform(rng, -1, 1);
    return t;
  };
  HostTensor q = make({pr.batch, pr.x1, pr.x2, pr.heads, pr.d});
  HostTensor k = make({pr.batch, pr.x1, pr.x2, pr.heads, pr.d});
  HostTensor v = make({pr.batch, pr.x1, pr.x2, pr.heads, pr.d});
  HostTensor out = make({pr.batch, pr.x1, pr.x2, pr.heads, pr.d});
  HostTensor dout = make({pr.batch, pr.x1, pr.x2, pr.heads, pr.d});
  HostTensor dq = make(q.shape()), dk = make(k.shape()), dv = make(v.shape());
  HostTensor lse(DType::kFloat32, {pr.batch, pr.heads, pr.x1, pr.x2});
  DeviceCopies dev;
  const fmha::TensorView gq = dev.upload(q), gk = dev.upload(k), gv = dev.upload(v);
  const fmha::TensorView gout = dev.upload(out), gdout = dev.upload(dout), glse = dev.upload(lse);
  const fmha::TensorView gdq = dev.upload(dq), gdk = dev.upload(dk), gdv = dev.upload(dv);
  ASSERT_FALSE(::testing::Test::HasFailure());

  fmha::NeighborhoodOptions na;
  na.num_dims = 2;
  na.kernel_size = {pr.kernel, pr.kernel, 1};
  fmha::NeighborhoodForwardParams nf;
  nf.q = gq, nf.k = gk, nf.v = gv, nf.out = gout, nf.lse = glse, nf.neighborhood = na;
  fmha::NeighborhoodBackwardParams nb;
  nb.q = gq, nb.k = gk, nb.v = gv, nb.out = gout, nb.lse = glse, nb.dout = gdout;
  nb.neighborhood = na;
  nb.grads.dq = gdq, nb.grads.dk = gdk, nb.grads.dv = gdv;

  // The same buffers viewed as dense [B, N, H, D] and lse [B, H, N].
  auto dense = [&](fmha::TensorView t) {
    return fmha::TensorView::strided(t.data, t.dtype, {pr.batch, n, pr.heads, pr.d},
                                     {n * pr.heads * pr.d, pr.heads * pr.d, pr.d, 1}, t.device);
  };
  const fmha::TensorView dense_lse = fmha::TensorView::strided(
      glse.data, glse.dtype, {pr.batch, pr.heads, n}, {pr.heads * n, n, 1}, glse.device);
  fmha::AttentionForwardParams df;
  df.q = dense(gq), df.k = dense(gk), df.v = dense(gv), df.out = dense(gout), df.lse = dense_lse;
  fmha::AttentionBackwardParams db;
  db.q = df.q, db.k = df.k, db.v = df.v, db.out = df.out, db.lse = dense_lse;
  db.dout = dense(gdout);
  db.grads.dq = dense(gdq), db.grads.dk = dense(gdk), db.grads.dv = dense(gdv);

  const double pairs_na = static_cast<double>(pr.batch * pr.heads * n) * pr.kernel * pr.kernel;
  const double pairs_dense = static_cast<double>(pr.batch * pr.heads) * n * n;
  const double fwd = 4.0 * pr.d, bwd = 10.0 * pr.d;
  // Each backward right after its own forward, which made the out and lse it reads.
  const double na_f = median_ms([&] { return fmha::run(nf, nullptr); });
  const double na_b = median_ms([&] { return fmha::run(nb, nullptr); });
  const double de_f = median_ms([&] { return fmha::run(df, nullptr); });
  const double de_b = median_ms([&] { return fmha::run(db, nullptr); });
  auto tflops = [](double flops, double ms) { return flops / ms * 1e-9; };
  std::printf(
      "[ throughput ] bf16 B%lld H%lld grid %lldx%lld K%lld D%lld\n"
      "  forward : NA %.3f ms %.1f TFLOP/s | dense %.3f ms %.1f TFLOP/s | NA/dense %.1f%%\n"
      "  backward: NA %.3f ms %.1f TFLOP/s | dense %.3f ms %.1f TFLOP/s | NA/dense %.1f%%\n",
      static_cast<long long>(pr.batch), static_cast<long long>(pr.heads),
      static_cast<long long>(pr.x1), static_cast<long long>(pr.x2),
      static_cast<long long>(pr.kernel), static_cast<long long>(pr.d), na_f,
      tflops(pairs_na * fwd, na_f), de_f, tflops(pairs_dense * fwd, de_f),
      100 * tflops(pairs_na * fwd, na_f) / tflops(pairs_dense * fwd, de_f), na_b,
      tflops(pairs_na * bwd, na_b), de_b, tflops(pairs_dense * bwd, de_b),
      100 * tflops(pairs_na * bwd, na_b) / tflops(pairs_dense * bwd, de_b));
}

TEST(CudaNeighborhoodThroughput, DISABLED_Na2d64x64K13D128) {
  measure({.batch = 4, .heads = 8, .x1 = 64, .x2 = 64, .d = 128, .kernel = 13});
}

TEST(CudaNeighborhoodThroughput, DISABLED_Na2d32x32K7D64) {
  measure({.batch = 8, .heads = 8, .x1 = 32, .x2 = 32, .d = 64, .kernel = 7});
}

}  // namespace
}  // namespace fmha_cuda_test
