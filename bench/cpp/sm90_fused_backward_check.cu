// sm90-fused-backward-check: the warp-specialized fused sm90 backward (mainloop_bwd_fused.cuh)
// alone, without the library or Python: first against a float64 reference on small odd shapes
// (causal both alignments, GQA, Lq != Lk, fully masked rows, softcap alone), outputs poisoned with
// NaN before each run; then timed against the split backward's two kernels (dK/dV and dQ,
// overlapped as the library launches them) on the standard grid (bf16, 16k tokens, hidden 2048,
// D 64 / 128, L 512 to 16384, causal and not): CUDA events, the L2 flushed before each run, the
// median of 30 runs. With `--softcap`, the same grid under softcap 50: the fused kernel's softcap
// policy against its plain / window policy on the same inputs (issue 32's ratio) and against the
// split kernels' general policy (the route softcap took before).
// The fused time includes what the fused backward adds around its kernel (zeroing the dQ
// accumulator and converting it); the preprocess, which both share, is left out of both. Built by
// hand for sm_90a:
//
//   nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a \
//        -Isrc -Iinclude -o sm90-fused-backward-check bench/cpp/sm90_fused_backward_check.cu -lcuda
//
// Arguments: none (checks, then the grid), `--check-only`, `--softcap` (checks, then the softcap
// grid), `--only D L causal [softcap]` (one timing cell).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/sm90/launch_bwd.cuh"
#include "cuda/sm90/launch_bwd_fused.cuh"
#include "kernel_timing.h"

namespace fmha::cuda::sm90 {
template Status launch_backward_fused<__nv_bfloat16, 64, PolicyPlain>(const BackwardParams&,
                                                                      cudaStream_t);
template Status launch_backward_fused<__nv_bfloat16, 64, PolicyWindow>(const BackwardParams&,
                                                                       cudaStream_t);
template Status launch_backward_fused<__nv_bfloat16, 128, PolicyPlain>(const BackwardParams&,
                                                                       cudaStream_t);
template Status launch_backward_fused<__nv_bfloat16, 128, PolicyWindow>(const BackwardParams&,
                                                                        cudaStream_t);
template Status launch_backward_fused<__nv_bfloat16, 64, PolicySoftcap>(const BackwardParams&,
                                                                        cudaStream_t);
template Status launch_backward_fused<__nv_bfloat16, 128, PolicySoftcap>(const BackwardParams&,
                                                                         cudaStream_t);
}  // namespace fmha::cuda::sm90

namespace {

using fmha::Status;
using fmha::cuda::BackwardParams;
using fmha::cuda::ForwardParams;
using fmha::cuda::PolicyGeneral;
using fmha::cuda::PolicyPlain;
using fmha::cuda::PolicySoftcap;
using fmha::cuda::PolicyWindow;
using bf16 = __nv_bfloat16;
namespace sm90 = fmha::cuda::sm90;

struct Shape {
  int B, H, Hkv, Lq, Lk, D;
  bool causal, bottom_right;
  int left = -1, right = -1;  // a sliding window instead of causal when right >= 0
  float softcap = 0.0f;       // > 0: s = softcap * tanh(scale q.k / softcap)
};

constexpr std::size_t kTileFloats = sm90::DqAccumulator<64>::kTileFloats;
static_assert(kTileFloats == sm90::DqAccumulator<128>::kTileFloats, "one tile size");

float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16(x));
}

std::vector<float> random_host(std::size_t n, std::mt19937& gen) {
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(dist(gen));
  return v;
}

void* upload_bf16(const std::vector<float>& v) {
  std::vector<bf16> h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) h[i] = __float2bfloat16(v[i]);
  void* d = nullptr;
  CHECK(cudaMalloc(&d, h.size() * 2 + 16));
  CHECK(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> download_bf16(const void* d, std::size_t n) {
  std::vector<bf16> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = __bfloat162float(h[i]);
  return v;
}

// Layout and options of a shape: q, dout, out [B, Lq, H, D], k, v [B, Lk, Hkv, D] contiguous,
// statistics [B, H, Lq].
void set_shape(BackwardParams& p, const Shape& s) {
  ForwardParams& f = p.fwd;
  f.q_batch_stride = std::int64_t(s.Lq) * s.H * s.D;
  f.q_row_stride = std::int64_t(s.H) * s.D;
  f.q_head_stride = s.D;
  f.k_batch_stride = f.v_batch_stride = std::int64_t(s.Lk) * s.Hkv * s.D;
  f.k_row_stride = f.v_row_stride = std::int64_t(s.Hkv) * s.D;
  f.k_head_stride = f.v_head_stride = s.D;
  f.batch = s.B;
  f.seqlen_q = s.Lq;
  f.seqlen_k = s.Lk;
  f.heads = s.H;
  f.kv_group = s.H / s.Hkv;
  f.head_dim = f.value_dim = s.D;
  f.vector_loads = f.vector_stores = true;
  f.scale_log2 = 1.0f / std::sqrt(float(s.D)) * 1.4426950408889634f;
  if (s.softcap > 0.0f) {
    f.softcap_log2 = s.softcap * 1.4426950408889634f;
    f.scale_over_softcap = 1.0f / std::sqrt(float(s.D)) / s.softcap;
  }
  if (s.causal) {
    f.window_right = 0;
    f.bottom_right = s.bottom_right;
  }
  if (s.right >= 0) {
    f.window_left = s.left;
    f.window_right = s.right;
    f.bottom_right = s.bottom_right;
  }
  p.dout_batch_stride = p.dq_batch_stride = f.q_batch_stride;
  p.dout_row_stride = p.dq_row_stride = f.q_row_stride;
  p.dout_head_stride = p.dq_head_stride = s.D;
  p.dk_batch_stride = p.dv_batch_stride = f.k_batch_stride;
  p.dk_row_stride = p.dv_row_stride = f.k_row_stride;
  p.dk_head_stride = p.dv_head_stride = s.D;
  p.stat_batch_stride = std::int64_t(s.H) * s.Lq;
  p.stat_head_stride = s.Lq;
  p.scale = 1.0f / std::sqrt(float(s.D));
}

// Row statistics [B, H, Lq] (lse in log2 units, Delta) to the device in the layout the fused
// backward reads: each head's rows padded to whole 128-query tiles with lse +inf and Delta 0, as
// the library's preprocess pads them.
void upload_stats(BackwardParams& p, int B, int H, int Lq, const std::vector<float>& lse_log2,
                  const std::vector<float>& delta) {
  const std::size_t rows = (std::size_t(Lq) + 127) / 128 * 128;
  std::vector<float> l(std::size_t(B) * H * rows, INFINITY), d(l.size(), 0.0f);
  for (std::size_t bh = 0; bh < std::size_t(B) * H; ++bh) {
    for (int i = 0; i < Lq; ++i) {
      l[bh * rows + i] = lse_log2[bh * Lq + i];
      d[bh * rows + i] = delta[bh * Lq + i];
    }
  }
  CHECK(cudaMalloc(&p.lse_log2, l.size() * 4));
  CHECK(cudaMalloc(&p.delta, d.size() * 4));
  CHECK(cudaMemcpy(p.lse_log2, l.data(), l.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(p.delta, d.data(), d.size() * 4, cudaMemcpyHostToDevice));
  p.stat_rows = static_cast<std::int64_t>(rows);
  p.stat_head_stride = static_cast<std::int64_t>(rows);
  p.stat_batch_stride = static_cast<std::int64_t>(rows) * H;
}

// Zeroes the accumulator, runs the fused backward.
template <int kD, typename Policy>
Status run_fused(BackwardParams& p, std::size_t accum_bytes, cudaStream_t stream = 0) {
  CHECK(cudaMemsetAsync(p.dq_accum, 0, accum_bytes, stream));
  return sm90::launch_backward_fused<bf16, kD, Policy>(p, stream);
}

std::size_t accumulator_floats(BackwardParams& p, int D) {
  if (D == 64) {
    sm90::set_dq_accumulator_strides<64>(&p, p.fwd.seqlen_q, false);
  } else {
    sm90::set_dq_accumulator_strides<128>(&p, p.fwd.seqlen_q, false);
  }
  return static_cast<std::size_t>(p.accum_batch_stride) * p.fwd.batch;
}

// `masked`: the window policy (causal or a window); `softcap`: the softcap policy, which takes
// either.
Status launch_fused(BackwardParams& p, int D, bool causal, std::size_t accum_bytes,
                    bool softcap = false) {
  if (softcap) {
    return D == 64 ? run_fused<64, PolicySoftcap>(p, accum_bytes)
                   : run_fused<128, PolicySoftcap>(p, accum_bytes);
  }
  if (D == 64) {
    return causal ? run_fused<64, PolicyWindow>(p, accum_bytes)
                  : run_fused<64, PolicyPlain>(p, accum_bytes);
  }
  return causal ? run_fused<128, PolicyWindow>(p, accum_bytes)
                : run_fused<128, PolicyPlain>(p, accum_bytes);
}

// The split form's two kernels of one policy: dK / dV, then dQ.
template <int kD, typename Policy>
Status launch_split_pair(const BackwardParams& p, cudaStream_t stream) {
  const Status s = sm90::launch_backward_dkdv<bf16, kD, Policy>(p, stream);
  if (!s.ok()) return s;
  return sm90::launch_backward_dq<bf16, kD, Policy>(p, stream);
}

Status launch_split(BackwardParams p, int D, bool causal, cudaStream_t stream,
                    bool softcap = false) {
  p.dq_overlaps_dkdv = true;
  p.dq_accum = nullptr;  // else the dK/dV launcher runs its own fused form
  if (softcap) {  // the general policy, as the library's split route runs softcap
    return D == 64 ? launch_split_pair<64, PolicyGeneral>(p, stream)
                   : launch_split_pair<128, PolicyGeneral>(p, stream);
  }
  if (D == 64) {
    return causal ? launch_split_pair<64, PolicyWindow>(p, stream)
                  : launch_split_pair<64, PolicyPlain>(p, stream);
  }
  return causal ? launch_split_pair<128, PolicyWindow>(p, stream)
                : launch_split_pair<128, PolicyPlain>(p, stream);
}

bool visible(const Shape& s, int i, int j) {
  const int offset = s.bottom_right ? s.Lk - s.Lq : 0;
  if (s.right >= 0) return j <= i + offset + s.right && j >= i + offset - s.left;
  if (!s.causal) return true;
  return j <= i + offset;
}

// ||a - ref|| / ||ref|| over every element.
double relative_error(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - ref[i];
    num += std::isfinite(a[i]) ? d * d : INFINITY;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

// One shape against float64; returns whether every gradient is within the bound.
bool check_shape(const Shape& s, std::mt19937& gen) {
  const int G = s.H / s.Hkv;
  const std::size_t nq = std::size_t(s.B) * s.Lq * s.H * s.D;
  const std::size_t nk = std::size_t(s.B) * s.Lk * s.Hkv * s.D;
  const std::vector<float> q = random_host(nq, gen), k = random_host(nk, gen),
                           v = random_host(nk, gen), dout = random_host(nq, gen);
  std::vector<double> dq(nq, 0.0), dk(nk, 0.0), dv(nk, 0.0);
  std::vector<float> lse_log2(std::size_t(s.B) * s.H * s.Lq), delta(lse_log2.size());
  const double scale = 1.0 / std::sqrt(double(s.D));
  auto qi = [&](int b, int i, int h) { return (std::size_t(b) * s.Lq + i) * s.H * s.D + h * s.D; };
  auto kj = [&](int b, int j, int h) {
    return (std::size_t(b) * s.Lk + j) * s.Hkv * s.D + (h / G) * s.D;
  };
  std::vector<double> P(s.Lk), factor(s.Lk);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.H; ++h) {
      for (int i = 0; i < s.Lq; ++i) {
        double m = -INFINITY;
        for (int j = 0; j < s.Lk; ++j) {
          double dot = 0.0;
          for (int c = 0; c < s.D; ++c) dot += double(q[qi(b, i, h) + c]) * k[kj(b, j, h) + c];
          const double score = s.softcap > 0.0f
                                   ? s.softcap * std::tanh(dot * scale / s.softcap)
                                   : dot * scale;
          P[j] = visible(s, i, j) ? score : -INFINITY;
          const double t = s.softcap > 0.0f ? score / s.softcap : 0.0;
          factor[j] = 1.0 - t * t;  // softcap's chain-rule factor (1 without softcap)
          m = std::max(m, P[j]);
        }
        double sum = 0.0;
        for (int j = 0; j < s.Lk; ++j) sum += m == -INFINITY ? 0.0 : std::exp(P[j] - m);
        const double lse = m == -INFINITY ? -INFINITY : m + std::log(sum);
        std::vector<double> out(s.D, 0.0);
        for (int j = 0; j < s.Lk; ++j) {
          P[j] = lse == -INFINITY ? 0.0 : std::exp(P[j] - lse);
          for (int c = 0; c < s.D; ++c) out[c] += P[j] * v[kj(b, j, h) + c];
        }
        // The forward's output in bf16, as Delta sees it.
        double d = 0.0;
        for (int c = 0; c < s.D; ++c)
          d += double(dout[qi(b, i, h) + c]) * round_bf16(float(out[c]));
        const std::size_t stat = (std::size_t(b) * s.H + h) * s.Lq + i;
        lse_log2[stat] = lse == -INFINITY ? INFINITY : float(lse * 1.4426950408889634);
        delta[stat] = float(d);
        for (int j = 0; j < s.Lk; ++j) {
          double x = 0.0;
          for (int c = 0; c < s.D; ++c) x += double(dout[qi(b, i, h) + c]) * v[kj(b, j, h) + c];
          const double ds = P[j] * (x - d) * factor[j];
          for (int c = 0; c < s.D; ++c) {
            dq[qi(b, i, h) + c] += scale * ds * k[kj(b, j, h) + c];
            dk[kj(b, j, h) + c] += scale * ds * q[qi(b, i, h) + c];
            dv[kj(b, j, h) + c] += P[j] * dout[qi(b, i, h) + c];
          }
        }
      }
    }
  }

  BackwardParams p;
  set_shape(p, s);
  p.fwd.q = upload_bf16(q);
  p.fwd.k = upload_bf16(k);
  p.fwd.v = upload_bf16(v);
  p.dout = upload_bf16(dout);
  CHECK(cudaMalloc(&p.dq, nq * 2));
  CHECK(cudaMalloc(&p.dk, nk * 2));
  CHECK(cudaMalloc(&p.dv, nk * 2));
  CHECK(cudaMemset(p.dq, 0xff, nq * 2));  // NaN: an unwritten element fails
  CHECK(cudaMemset(p.dk, 0xff, nk * 2));
  CHECK(cudaMemset(p.dv, 0xff, nk * 2));
  upload_stats(p, s.B, s.H, s.Lq, lse_log2, delta);
  const std::size_t accum = accumulator_floats(p, s.D);
  CHECK(cudaMalloc(&p.dq_accum, accum * 4 + accum / kTileFloats * 4));
  const bool masked = s.causal || s.right >= 0;
  const bool softcap = s.softcap > 0.0f;
  const Status st = launch_fused(p, s.D, masked, accum * 4, softcap);
  CHECK(cudaDeviceSynchronize());
  const double eq = relative_error(download_bf16(p.dq, nq), dq);
  const double ek = relative_error(download_bf16(p.dk, nk), dk);
  const double ev = relative_error(download_bf16(p.dv, nk), dv);
  // Deterministic mode: the same gradients within the bound, and the same bits twice.
  p.dq_semaphore = reinterpret_cast<int*>(p.dq_accum + accum);
  const std::size_t both = accum * 4 + accum / kTileFloats * 4;
  CHECK(cudaMemset(p.dq, 0xff, nq * 2));
  const Status first_run = launch_fused(p, s.D, masked, both, softcap);
  CHECK(cudaDeviceSynchronize());
  const double eq_det = relative_error(download_bf16(p.dq, nq), dq);
  const unsigned long long first = device_digest(p.dq, nq * 2);
  const Status sd = first_run.ok() ? launch_fused(p, s.D, masked, both, softcap) : first_run;
  CHECK(cudaDeviceSynchronize());
  const bool repeated = device_digest(p.dq, nq * 2) == first;
  p.dq_semaphore = nullptr;
  const bool ok =
      st.ok() && sd.ok() && eq < 1e-2 && ek < 1e-2 && ev < 1e-2 && eq_det < 1e-2 && repeated;
  std::printf(
      "check B=%d H=%d Hkv=%d Lq=%d Lk=%d D=%d causal=%d window=(%d, %d)%s softcap=%g: dq %.2e "
      "dk %.2e dv %.2e, deterministic dq %.2e %s: %s%s\n",
      s.B, s.H, s.Hkv, s.Lq, s.Lk, s.D, s.causal, s.left, s.right,
      s.bottom_right ? " (bottom-right)" : "", s.softcap, eq, ek,
      ev, eq_det, repeated ? "repeated" : "NOT REPEATED", ok ? "ok" : "FAIL ",
      st.ok() ? "" : st.message().c_str());
  free_backward_buffers(p);
  return ok;
}

// Random bf16 values from a hash of the index (the timing inputs: 2 x 64 MB a tensor at the
// largest cell, too slow to draw on the host).
__global__ void fill_random(bf16* x, std::size_t n, unsigned seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = __float2bfloat16((h & 0xffff) / 32768.0f - 1.0f);
  }
}

void* device_filled(std::size_t n, unsigned seed) {
  void* d = nullptr;
  CHECK(cudaMalloc(&d, n * 2));
  fill_random<<<1024, 256>>>(static_cast<bf16*>(d), n, seed);
  CHECK(cudaGetLastError());
  return d;
}

// With softcap > 0: the softcap policy ("fused") against the plain / window policy on the same
// inputs ("plain"), and the split kernels' general policy ("split").
void time_cell(int D, int L, bool causal, float softcap = 0.0f) {
  const int B = 16384 / L, H = 2048 / D;
  const Shape s{B, H, H, L, L, D, causal, false, -1, -1, softcap};
  const bool capped = softcap > 0.0f;
  const std::size_t n = std::size_t(B) * L * H * D;
  BackwardParams p;
  set_shape(p, s);
  p.fwd.q = device_filled(n, 1);
  p.fwd.k = device_filled(n, 2);
  p.fwd.v = device_filled(n, 3);
  p.dout = device_filled(n, 4);
  CHECK(cudaMalloc(&p.dq, n * 2));
  CHECK(cudaMalloc(&p.dk, n * 2));
  CHECK(cudaMalloc(&p.dv, n * 2));
  const std::size_t stats = std::size_t(B) * H * L;
  // Statistics of about the right size: lse near log(L) in log2 units, Delta small.
  upload_stats(p, B, H, L, std::vector<float>(stats, std::log2(float(L))),
               std::vector<float>(stats, 0.01f));
  const std::size_t accum = accumulator_floats(p, D);
  CHECK(cudaMalloc(&p.dq_accum, accum * 4 + accum / kTileFloats * 4));
  int* const semaphores = reinterpret_cast<int*>(p.dq_accum + accum);
  static cudaStream_t stream = [] {
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    return st;
  }();
  const float fused_ms =
      median_launch_ms([&] { return launch_fused(p, D, causal, accum * 4, capped); });
  const float split_ms =
      median_launch_ms([&] { return launch_split(p, D, causal, stream, capped); }, stream);
  p.dq_semaphore = semaphores;
  const std::size_t both = accum * 4 + accum / kTileFloats * 4;
  const float ordered_ms =
      median_launch_ms([&] { return launch_fused(p, D, causal, both, capped); });
  p.dq_semaphore = nullptr;
  const double pairs = causal ? double(L) * (L + 1) / 2 : double(L) * L;
  const double flops = 2.5 * 4.0 * B * H * pairs * D;
  if (capped) {
    const float plain_ms = median_launch_ms([&] { return launch_fused(p, D, causal, accum * 4); });
    std::printf(
        "time softcap D=%3d L=%5d causal=%d  fused %.3f ms %4.0f TFLOP/s  plain fused %.3f ms "
        "%4.0f TFLOP/s (softcap %+.1f%%)  split general %.3f ms %4.0f TFLOP/s %.2fx  "
        "deterministic %.3f ms (%+.0f%%)\n",
        D, L, causal, fused_ms, flops / fused_ms * 1e-9, plain_ms, flops / plain_ms * 1e-9,
        (fused_ms / plain_ms - 1.0) * 100.0, split_ms, flops / split_ms * 1e-9,
        split_ms / fused_ms, ordered_ms, (ordered_ms / fused_ms - 1.0) * 100.0);
    free_backward_buffers(p);
    return;
  }
  std::printf(
      "time D=%3d L=%5d causal=%d  fused %.3f ms %4.0f TFLOP/s  split %.3f ms %4.0f TFLOP/s  "
      "%.2fx  deterministic %.3f ms %4.0f TFLOP/s (%+.0f%%)\n",
      D, L, causal, fused_ms, flops / fused_ms * 1e-9, split_ms, flops / split_ms * 1e-9,
      split_ms / fused_ms, ordered_ms, flops / ordered_ms * 1e-9,
      (ordered_ms / fused_ms - 1.0) * 100.0);
  free_backward_buffers(p);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // a hang still shows how far it got
  std::mt19937 gen(7);
  bool ok = true;
  const Shape shapes[] = {
      {1, 2, 2, 64, 128, 64, false, false},  {2, 3, 3, 77, 200, 64, false, false},
      {1, 4, 2, 300, 300, 64, true, false},  {1, 2, 1, 129, 257, 64, true, true},
      {1, 2, 2, 64, 128, 128, false, false}, {2, 2, 2, 77, 200, 128, false, false},
      {1, 4, 2, 300, 300, 128, true, false}, {1, 2, 1, 129, 257, 128, true, true},
      {1, 2, 2, 200, 100, 128, true, false}, {1, 1, 1, 1, 1, 128, false, false},
      {1, 6, 2, 513, 385, 128, true, true},  {1, 6, 3, 250, 390, 64, false, false},
      {1, 2, 2, 300, 100, 64, true, true},   {1, 2, 2, 300, 100, 128, true, true},
      // Sliding windows: rows past Lq in the last query tile would reach key blocks that no real
      // row reaches; rows whose window misses every key.
      {1, 2, 1, 90, 400, 128, false, false, 50, 30},  {1, 2, 2, 90, 400, 64, false, false, 50, 30},
      {1, 2, 2, 400, 150, 128, false, false, 20, 10}, {1, 2, 1, 333, 90, 64, false, true, 5, 40},
      // Softcap alone (PolicySoftcap): mild (softcap 5 over scores about N(0, 1)) and hard (0.7).
      {2, 3, 3, 77, 200, 64, false, false, -1, -1, 5.0f},
      {1, 4, 2, 300, 300, 64, true, false, -1, -1, 0.7f},
      {1, 2, 1, 129, 257, 128, true, true, -1, -1, 2.0f},
      {1, 6, 2, 513, 385, 128, true, true, -1, -1, 0.7f},
      {1, 2, 2, 90, 400, 64, false, false, 50, 30, 3.0f},
      {1, 2, 1, 400, 150, 128, false, false, 20, 10, 5.0f},
      {1, 1, 1, 1, 1, 128, false, false, -1, -1, 1.0f},
  };
  if (argc > 4 && std::strcmp(argv[1], "--only") == 0) {  // one timing cell: D L causal [softcap]
    time_cell(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]) != 0,
              argc > 5 ? static_cast<float>(std::atof(argv[5])) : 0.0f);
    return 0;
  }
  for (const Shape& s : shapes) ok = check_shape(s, gen) && ok;
  std::printf("checks: %s\n", ok ? "all ok" : "FAILED");
  if (!ok || (argc > 1 && std::strcmp(argv[1], "--check-only") == 0)) return ok ? 0 : 1;
  const float softcap = argc > 1 && std::strcmp(argv[1], "--softcap") == 0 ? 50.0f : 0.0f;
  for (int D : {64, 128}) {
    for (bool causal : {false, true}) {
      for (int L : {512, 1024, 2048, 4096, 8192, 16384}) time_cell(D, L, causal, softcap);
    }
  }
  return 0;
}
