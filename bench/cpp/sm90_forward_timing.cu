// sm90-forward-timing: the sm90 forward kernel alone, launched through its launcher on random bf16
// inputs, for comparing builds of the kernel (two commits, or a kernel with one stage removed)
// without the library or Python: CUDA events around each run, the L2 flushed in between, the
// median of 50 runs (FMHA_TIMING_RUNS sets another count). Built by hand, once per variant, for
// sm_90a; the head-dim bucket and the head dim are compile-time arguments, VARIANT labels the
// output:
//
//   nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a \
//        -Isrc -Iinclude -DFMHA_TIMING_BUCKET=96 -DFMHA_TIMING_D=80 -DVARIANT='"main"' \
//        -o sm90-forward-timing bench/cpp/sm90_forward_timing.cu -lcuda
//
// Cases: the SAM-B shape (SAM-H at D 80), then 16k tokens at L 512 / 2048 / 8192 with 2048 / D
// heads (a hidden size of 2048; 2000 at D 80), non-causal and causal (issue 4's grid). The
// launcher's switches apply (FMHA_SM90_LONG_ROWS, FMHA_SM90_WIDE_WINDOW, ...), so one build times
// both sides of one. With the
// argument `bias`: the SAM shape without and with a bias [1, H, L, L] (random, shared by the
// batches; the bias policy), issue 4's bias case. FMHA_TIMING_L=L1,L2,...: 16k tokens at those
// sequence lengths only (4096 includes the SAM shape); FMHA_TIMING_POLICY=window: the non-causal
// cases through the window policy with an unbounded window (its two-warpgroup kernel where the
// plain policy takes three). No correctness check: the GPU suite is the test.
// TFLOP/s count visible pairs only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include "cuda/sm90/launch_fwd.cuh"
#include "kernel_timing.h"

#ifndef VARIANT
#define VARIANT "build"
#endif

namespace fmha::cuda::sm90 {
template Status launch_forward<__nv_bfloat16, FMHA_TIMING_BUCKET, PolicyPlain>(const ForwardParams&,
                                                                               cudaStream_t);
template Status launch_forward<__nv_bfloat16, FMHA_TIMING_BUCKET, PolicyWindow>(
    const ForwardParams&, cudaStream_t);
template Status launch_forward<__nv_bfloat16, FMHA_TIMING_BUCKET, PolicyBias>(const ForwardParams&,
                                                                              cudaStream_t);
}  // namespace fmha::cuda::sm90

using fmha::cuda::ForwardParams;

static bool window_policy() {
  const char* env = std::getenv("FMHA_TIMING_POLICY");
  return env != nullptr && std::string_view(env) == "window";
}

static double run_case(int B, int H, int L, int D, bool causal, bool bias = false) {
  const std::size_t n = std::size_t(B) * L * H * D;
  std::mt19937 gen(42);
  // Q, K and V drawn apart: with one tensor for all three, each row's largest score sat on the
  // diagonal, unlike a model's.
  void* q = device_random(n, gen, true);
  void* k = device_random(n, gen, true);
  void* v = device_random(n, gen, true);
  void* o = nullptr;
  CHECK(cudaMalloc(&o, n * 2));
  void* bias_data = nullptr;
  ForwardParams p;
  if (bias) {  // [1, H, L, L], contiguous: a batch stride of 0
    const std::size_t bias_n = std::size_t(H) * L * L;
    bias_data = device_random(bias_n, gen, true);
    p.bias = bias_data;
    p.bias_stride[0] = 0;
    p.bias_stride[1] = std::int64_t(L) * L;
    p.bias_stride[2] = L;
    p.bias_stride[3] = 1;
  }
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = o;
  set_dense_forward(p, B, H, L, D);
  if (causal) p.window_right = 0;
  // The call's scratch memory, as forward.cu hands it over: the persistent kernel's tile counter.
  void* scratch = nullptr;
  CHECK(cudaMalloc(&scratch, 256));
  p.scratch = scratch;
  auto launch = [&] {
    using namespace fmha::cuda;
    auto st =
        bias     ? sm90::launch_forward<__nv_bfloat16, FMHA_TIMING_BUCKET, PolicyBias>(p, nullptr)
        : causal || window_policy()
            ? sm90::launch_forward<__nv_bfloat16, FMHA_TIMING_BUCKET, PolicyWindow>(p, nullptr)
                 : sm90::launch_forward<__nv_bfloat16, FMHA_TIMING_BUCKET, PolicyPlain>(p, nullptr);
    if (!st.ok()) {
      std::fprintf(stderr, "launch failed\n");
      std::exit(1);
    }
  };
  // FMHA_TIMING_RUNS: more runs than the default 50, e.g. to watch clocks and power under a
  // sustained load.
  const char* runs_env = std::getenv("FMHA_TIMING_RUNS");
  const int runs = runs_env != nullptr ? std::max(10, std::atoi(runs_env)) : 50;
  const std::vector<float> ms = sorted_launch_ms(launch, runs);
  CHECK(cudaFree(q));
  CHECK(cudaFree(k));
  CHECK(cudaFree(v));
  CHECK(cudaFree(o));
  CHECK(cudaFree(scratch));
  if (bias_data != nullptr) CHECK(cudaFree(bias_data));
  const double pairs = causal ? double(L) * (L + 1) / 2 : double(L) * L;
  const double flops = 4.0 * pairs * D * B * H;
  std::printf(
      "%s D=%d B=%d H=%d L=%d causal=%d bias=%d median %.4f ms p10 %.4f p90 %.4f  %.1f TFLOP/s\n",
      VARIANT, D, B, H, L, causal, bias, ms[runs / 2], ms[runs / 10], ms[runs * 9 / 10],
      flops / ms[runs / 2] / 1e9);
  return ms[runs / 2];
}

#ifndef FMHA_TIMING_D
#define FMHA_TIMING_D FMHA_TIMING_BUCKET
#endif
int main(int argc, char** argv) {
  const int D = FMHA_TIMING_D;
  const int tokens = 16384, heads = 2048 / D;
  if (argc > 1 && std::string_view(argv[1]) == "bias") {
    const int sam_heads = D == 80 ? 16 : 12;
    run_case(8, sam_heads, 4096, D, false);
    run_case(8, sam_heads, 4096, D, false, /*bias=*/true);
    return 0;
  }
  // FMHA_TIMING_L: only the cases of these sequence lengths (4096: the SAM shape too).
  std::vector<int> lengths = {512, 2048, 8192};
  bool sam = true;
  if (const char* env = std::getenv("FMHA_TIMING_L")) {
    lengths.clear();
    for (const char* s = env; *s != '\0';) {
      const int L = std::atoi(s);
      if (L > 0) lengths.push_back(L);
      const char* comma = std::strchr(s, ',');
      if (comma == nullptr) break;
      s = comma + 1;
    }
    sam = std::find(lengths.begin(), lengths.end(), 4096) != lengths.end();
  }
  if (sam) run_case(8, D == 80 ? 16 : 12, 4096, D, false);  // SAM-B (SAM-H at D 80) shape
  for (int L : lengths) run_case(tokens / L, heads, L, D, false);
  for (int L : lengths) run_case(tokens / L, heads, L, D, true);
  return 0;
}
