// gemm_bf16_pairs (bf16_dot.h): register blocks of 8 rows by 32 columns (16 zmm accumulators, as
// the fp32 AVX-512 product), compiled for AVX-512 BF16 in this file only.
#include "cpu/bf16_dot.h"

#include "cpu/kernels.h"

#if FMHA_CPU_X86
#include <immintrin.h>
#endif

namespace fmha::cpu {

#if FMHA_CPU_X86
namespace {

template <int C>  // 16-column vectors a row of the block
FMHA_CPU_TARGET_AVX512_BF16 inline __attribute__((always_inline)) void block_bf16_pairs(
    std::int64_t kp, const std::uint32_t* a, std::int64_t lda, const std::uint32_t* b,
    std::int64_t ldb, float* c, std::int64_t ldc) {
  constexpr int R = 8;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int x = 0; x < C; ++x) acc[r][x] = _mm512_setzero_ps();
  }
  for (std::int64_t p = 0; p < kp; ++p) {
    __m512bh bv[C];
    for (int x = 0; x < C; ++x)
      bv[x] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * ldb + 16 * x));
    for (int r = 0; r < R; ++r) {
      const __m512bh av =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[r * lda + p])));
      for (int x = 0; x < C; ++x) acc[r][x] = _mm512_dpbf16_ps(acc[r][x], av, bv[x]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int x = 0; x < C; ++x) _mm512_storeu_ps(c + r * ldc + 16 * x, acc[r][x]);
  }
}

}  // namespace

FMHA_CPU_TARGET_AVX512_BF16 void gemm_bf16_pairs(std::int64_t m, std::int64_t n, std::int64_t kp,
                                                 const std::uint32_t* a, std::int64_t lda,
                                                 const std::uint32_t* b, std::int64_t ldb, float* c,
                                                 std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; i += 8) {
    std::int64_t j = 0;
    for (; j + 32 <= n; j += 32)
      block_bf16_pairs<2>(kp, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc);
    for (; j < n; j += 16)
      block_bf16_pairs<1>(kp, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc);
  }
}
#endif

}  // namespace fmha::cpu
