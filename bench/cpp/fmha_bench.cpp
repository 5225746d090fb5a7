// fmha-bench: times fmha's dense attention alone, from C++, for users without Python.
//
//   fmha-bench --device cuda --dtype bf16 --b 4 --h 16 --hkv 16 --lq 4096 --d 128 --causal
//
// Forward and/or backward are timed separately: CUDA events around every run with the L2 cache
// flushed in between (CUDA tensors), std::chrono around every run (CPU tensors, fmha's CPU
// backend). Inputs are random normal values, never zeros. TFLOP/s count visible score entries
// only: forward = 2 * pairs * (D + Dv), backward = 2.5 x forward by convention.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/numeric.h"
#include "fmha/fmha.h"

#if FMHA_BENCH_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

struct Options {
  std::string device = "cpu";
  std::string dtype = "fp32";
  std::string direction = "both";  // fwd, bwd or both
  std::string backward_impl = "auto";  // auto, fused or split
  std::int64_t b = 1, h = 8, hkv = -1, lq = 1024, lk = -1, d = 64, dv = -1;
  bool causal = false;
  int warmup = 2;
  int reps = 20;
};

[[noreturn]] void usage(const char* message) {
  if (message) std::fprintf(stderr, "fmha-bench: %s\n\n", message);
  std::fprintf(stderr,
               "usage: fmha-bench [--device cpu|cuda] [--dtype fp32|fp16|bf16] [--b N] [--h N]\n"
               "                  [--hkv N] [--lq N] [--lk N] [--d N] [--dv N] [--causal]\n"
               "                  [--direction fwd|bwd|both] [--backward-impl auto|fused|split]\n"
               "                  [--warmup N] [--reps N]\n"
               "Defaults: cpu fp32 B=1 H=8 Hkv=H Lq=1024 Lk=Lq D=64 Dv=D, both directions,\n"
               "2 warm-up and 20 timed runs. Prints median and p10-p90 ms and TFLOP/s.\n");
  std::exit(message ? 2 : 0);
}

std::int64_t parse_int(const char* flag, const char* text) {
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || value < 0) {
    std::fprintf(stderr, "fmha-bench: %s needs a non-negative integer, got '%s'\n", flag, text);
    std::exit(2);
  }
  return value;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") usage(nullptr);
    if (flag == "--causal") {
      o.causal = true;
      continue;
    }
    if (i + 1 >= argc) usage(("missing value after " + flag).c_str());
    const char* value = argv[++i];
    if (flag == "--device") o.device = value;
    else if (flag == "--dtype") o.dtype = value;
    else if (flag == "--direction") o.direction = value;
    else if (flag == "--backward-impl") o.backward_impl = value;
    else if (flag == "--b") o.b = parse_int(argv[i - 1], value);
    else if (flag == "--h") o.h = parse_int(argv[i - 1], value);
    else if (flag == "--hkv") o.hkv = parse_int(argv[i - 1], value);
    else if (flag == "--lq") o.lq = parse_int(argv[i - 1], value);
    else if (flag == "--lk") o.lk = parse_int(argv[i - 1], value);
    else if (flag == "--d") o.d = parse_int(argv[i - 1], value);
    else if (flag == "--dv") o.dv = parse_int(argv[i - 1], value);
    else if (flag == "--warmup") o.warmup = static_cast<int>(parse_int(argv[i - 1], value));
    else if (flag == "--reps") o.reps = static_cast<int>(parse_int(argv[i - 1], value));
    else usage(("unknown option " + flag).c_str());
  }
  if (o.hkv < 0) o.hkv = o.h;
  if (o.lk < 0) o.lk = o.lq;
  if (o.dv < 0) o.dv = o.d;
  if (o.reps < 1) usage("--reps must be at least 1");
  if (o.device != "cpu" && o.device != "cuda") usage("--device must be cpu or cuda");
  if (o.direction != "fwd" && o.direction != "bwd" && o.direction != "both")
    usage("--direction must be fwd, bwd or both");
  if (o.backward_impl != "auto" && o.backward_impl != "fused" && o.backward_impl != "split")
    usage("--backward-impl must be auto, fused or split");
  return o;
}

fmha::DType parse_dtype(const std::string& name) {
  if (name == "fp32") return fmha::DType::kFloat32;
  if (name == "fp16") return fmha::DType::kFloat16;
  if (name == "bf16") return fmha::DType::kBFloat16;
  usage(("--dtype must be fp32, fp16 or bf16, got " + name).c_str());
}

void die_on_error(const fmha::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "fmha-bench: %s failed: %s\n", what, status.message().c_str());
  std::exit(1);
}

#if FMHA_BENCH_WITH_CUDA
void cuda_check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "fmha-bench: %s: %s\n", what, cudaGetErrorString(err));
  std::exit(1);
}
#endif

// Owns one buffer on the selected device; filled with random normal values (or left unset).
class Buffer {
 public:
  Buffer(bool cuda, std::size_t bytes) : cuda_(cuda), bytes_(bytes) {
#if FMHA_BENCH_WITH_CUDA
    if (cuda_) {
      cuda_check(cudaMalloc(&data_, std::max<std::size_t>(bytes, 1)), "cudaMalloc");
      return;
    }
#endif
    host_.resize(std::max<std::size_t>(bytes, 1));
    data_ = host_.data();
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
#if FMHA_BENCH_WITH_CUDA
    if (cuda_) cudaFree(data_);
#endif
  }
  void* data() const { return data_; }

  void fill_random(fmha::DType dtype, std::mt19937_64& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::size_t n = bytes_ / fmha::element_size(dtype);
    std::vector<std::uint8_t> staging(bytes_);
    for (std::size_t i = 0; i < n; ++i) {
      const float x = normal(rng);
      if (dtype == fmha::DType::kFloat32) {
        std::memcpy(staging.data() + 4 * i, &x, 4);
      } else {
        const std::uint16_t bits = dtype == fmha::DType::kFloat16 ? fmha::numeric::float_to_fp16(x)
                                                                  : fmha::numeric::float_to_bf16(x);
        std::memcpy(staging.data() + 2 * i, &bits, 2);
      }
    }
#if FMHA_BENCH_WITH_CUDA
    if (cuda_) {
      cuda_check(cudaMemcpy(data_, staging.data(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy");
      return;
    }
#endif
    std::memcpy(data_, staging.data(), bytes_);
  }

 private:
  bool cuda_;
  std::size_t bytes_;
  void* data_ = nullptr;
  std::vector<std::uint8_t> host_;
};

// Times `run` once per repetition; returns milliseconds, one entry per timed run.
class Timer {
 public:
  explicit Timer(bool cuda) : cuda_(cuda) {
#if FMHA_BENCH_WITH_CUDA
    if (cuda_) {
      // Overwriting twice the L2 size before each run evicts the previous run's inputs.
      int device = 0, l2_bytes = 0;
      cuda_check(cudaGetDevice(&device), "cudaGetDevice");
      cuda_check(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device), "L2 size");
      flush_bytes_ = 2 * static_cast<std::size_t>(std::max(l2_bytes, 1 << 20));
      cuda_check(cudaMalloc(&flush_, flush_bytes_), "cudaMalloc (L2 flush buffer)");
    }
#endif
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  ~Timer() {
#if FMHA_BENCH_WITH_CUDA
    if (flush_) cudaFree(flush_);
#endif
  }

  std::vector<double> time(const std::function<void()>& run, int warmup, int reps) {
    for (int i = 0; i < warmup; ++i) run();
    std::vector<double> ms;
#if FMHA_BENCH_WITH_CUDA
    if (cuda_) {
      std::vector<cudaEvent_t> start(reps), stop(reps);
      for (int i = 0; i < reps; ++i) {
        cuda_check(cudaEventCreate(&start[i]), "cudaEventCreate");
        cuda_check(cudaEventCreate(&stop[i]), "cudaEventCreate");
      }
      for (int i = 0; i < reps; ++i) {
        cuda_check(cudaMemsetAsync(flush_, i & 0xff, flush_bytes_), "L2 flush");
        cuda_check(cudaEventRecord(start[i]), "cudaEventRecord");
        run();
        cuda_check(cudaEventRecord(stop[i]), "cudaEventRecord");
      }
      cuda_check(cudaDeviceSynchronize(), "running fmha");
      for (int i = 0; i < reps; ++i) {
        float elapsed = 0.0f;
        cuda_check(cudaEventElapsedTime(&elapsed, start[i], stop[i]), "cudaEventElapsedTime");
        ms.push_back(elapsed);
        cudaEventDestroy(start[i]);
        cudaEventDestroy(stop[i]);
      }
      return ms;
    }
#endif
    for (int i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run();
      const auto t1 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    return ms;
  }

 private:
  bool cuda_;
#if FMHA_BENCH_WITH_CUDA
  void* flush_ = nullptr;
  std::size_t flush_bytes_ = 0;
#endif
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = (static_cast<double>(v.size()) - 1.0) * q;
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

// Visible (query, key) pairs of one (batch, head): causal is top-left aligned, j <= i.
double visible_pairs(const Options& o) {
  if (!o.causal) return static_cast<double>(o.lq) * static_cast<double>(o.lk);
  double pairs = 0.0;
  for (std::int64_t i = 0; i < o.lq; ++i) pairs += static_cast<double>(std::min(i + 1, o.lk));
  return pairs;
}

void report(const char* direction, const std::vector<double>& ms, double flops) {
  const double median = percentile(ms, 0.5);
  std::printf("%-4s  median %9.3f ms  p10-p90 %9.3f-%-9.3f ms  %10.4g TFLOP/s  (%zu runs)\n",
              direction, median, percentile(ms, 0.1), percentile(ms, 0.9),
              flops / (median * 1e-3) / 1e12, ms.size());
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const fmha::DType dtype = parse_dtype(o.dtype);
  const bool cuda = o.device == "cuda";
#if !FMHA_BENCH_WITH_CUDA
  if (cuda) usage("this build of fmha-bench has no CUDA support (configure with FMHA_ENABLE_CUDA)");
#endif
  const fmha::Device device = cuda ? fmha::Device::cuda(0) : fmha::Device::cpu();
  const std::size_t es = fmha::element_size(dtype);
  auto bytes = [&](std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
    return static_cast<std::size_t>(a * b * c * d) * es;
  };
  Buffer q(cuda, bytes(o.b, o.lq, o.h, o.d)), k(cuda, bytes(o.b, o.lk, o.hkv, o.d)),
      v(cuda, bytes(o.b, o.lk, o.hkv, o.dv)), out(cuda, bytes(o.b, o.lq, o.h, o.dv)),
      dout(cuda, bytes(o.b, o.lq, o.h, o.dv)), dq(cuda, bytes(o.b, o.lq, o.h, o.d)),
      dk(cuda, bytes(o.b, o.lk, o.hkv, o.d)), dv(cuda, bytes(o.b, o.lk, o.hkv, o.dv)),
      lse(cuda, static_cast<std::size_t>(o.b * o.h * o.lq) * sizeof(float));
  std::mt19937_64 rng(2024);
  for (Buffer* b : {&q, &k, &v, &dout}) b->fill_random(dtype, rng);

  auto view = [&](const Buffer& b, std::int64_t l, std::int64_t heads, std::int64_t dim) {
    return fmha::TensorView::contiguous(b.data(), dtype, {o.b, l, heads, dim}, device);
  };
  // Fields are assigned one by one: designated initialisers that leave optional members out trip
  // -Wmissing-field-initializers under -Wextra.
  fmha::AttentionForwardParams fwd;
  fwd.q = view(q, o.lq, o.h, o.d);
  fwd.k = view(k, o.lk, o.hkv, o.d);
  fwd.v = view(v, o.lk, o.hkv, o.dv);
  fwd.out = view(out, o.lq, o.h, o.dv);
  fwd.lse = fmha::TensorView::contiguous(lse.data(), fmha::DType::kFloat32, {o.b, o.h, o.lq}, device);
  fwd.options.causal = o.causal;
  fmha::AttentionBackwardParams bwd;
  bwd.q = fwd.q;
  bwd.k = fwd.k;
  bwd.v = fwd.v;
  bwd.out = fwd.out;
  bwd.lse = fwd.lse;
  bwd.dout = view(dout, o.lq, o.h, o.dv);
  bwd.options = fwd.options;
  bwd.grads.dq = view(dq, o.lq, o.h, o.d);
  bwd.grads.dk = view(dk, o.lk, o.hkv, o.d);
  bwd.grads.dv = view(dv, o.lk, o.hkv, o.dv);
  bwd.backward_impl = o.backward_impl == "fused"   ? fmha::BackwardImpl::kFused
                      : o.backward_impl == "split" ? fmha::BackwardImpl::kSplit
                                                   : fmha::BackwardImpl::kAuto;
  die_on_error(fmha::check(fwd), "forward check");
  die_on_error(fmha::check(bwd), "backward check");

  const double fwd_flops =
      2.0 * visible_pairs(o) * static_cast<double>(o.b * o.h) * static_cast<double>(o.d + o.dv);
  std::printf("fmha %s on %s: B=%lld H=%lld Hkv=%lld Lq=%lld Lk=%lld D=%lld Dv=%lld %s %s, backward %s\n",
              fmha::version(), o.device.c_str(), static_cast<long long>(o.b),
              static_cast<long long>(o.h), static_cast<long long>(o.hkv),
              static_cast<long long>(o.lq), static_cast<long long>(o.lk),
              static_cast<long long>(o.d), static_cast<long long>(o.dv), o.dtype.c_str(),
              o.causal ? "causal" : "non-causal", o.backward_impl.c_str());
  Timer timer(cuda);
  // The forward also runs once untimed: the backward needs its out and lse.
  die_on_error(fmha::run(fwd), "forward");
  if (o.direction != "bwd")
    report("fwd", timer.time([&] { die_on_error(fmha::run(fwd), "forward"); }, o.warmup, o.reps),
           fwd_flops);
  if (o.direction != "fwd")
    report("bwd", timer.time([&] { die_on_error(fmha::run(bwd), "backward"); }, o.warmup, o.reps),
           2.5 * fwd_flops);
  return 0;
}
