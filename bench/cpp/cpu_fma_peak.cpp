// The fp32 FMA peak of one x86 core with AVX-512: 12 independent chains of vfmadd on zmm registers
// (more than latency x pipes), timed in CPU seconds of the thread (CLOCK_THREAD_CPUTIME_ID), so the
// figure holds on a shared machine. The ceiling the fast CPU backend's GFLOP per CPU second compare
// with (bench/cpu_thread_time.py).
//
//   g++ -O3 -funroll-loops -o cpu-fma-peak bench/cpp/cpu_fma_peak.cpp && ./cpu-fma-peak
#include <immintrin.h>

#include <cstdio>
#include <ctime>

namespace {

constexpr int kChains = 12;

double thread_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

__attribute__((target("avx512f"))) float fma_chains(long iterations) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-3f * static_cast<float>(i));
  const __m512 scale = _mm512_set1_ps(0.999999f), shift = _mm512_set1_ps(1e-7f);
  for (long n = 0; n < iterations; ++n) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], scale, shift);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  float lanes[16];
  _mm512_storeu_ps(lanes, sum);
  float total = 0.0f;  // keeps the chains alive
  for (const float lane : lanes) total += lane;
  return total;
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("this CPU has no AVX-512\n");
    return 1;
  }
  const long iterations = 200000000;
  const double flops = static_cast<double>(iterations) * kChains * 16 * 2;
  for (int run = 0; run < 3; ++run) {
    const double start = thread_seconds();
    const float result = fma_chains(iterations);
    const double seconds = thread_seconds() - start;
    std::printf("%.1f GFLOP per CPU second (checksum %g)\n", flops / seconds * 1e-9, result);
  }
  return 0;
}
