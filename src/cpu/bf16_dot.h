// Products of two bf16 operands on AVX-512's bf16 dot product (vdpbf16ps): each instruction adds
// a0 b0 + a1 b1 for 16 pairs into 16 fp32 accumulators, twice the multiply-adds of an fp32 FMA. The
// operands are bf16 pairs packed in 32 bits (element 2p in the low half, 2p + 1 in the high half),
// the sums are fp32. Used for S = Q K^T (forward and backward) and dP = dO V^T (backward) of bf16
// inputs: both operands are the tensors' elements as given, so nothing is rounded that the fp32
// kernels keep. The products with P or dS as an operand stay on fp32 FMAs: P rounded to bf16 (as
// the GPU kernels round it for their tensor cores) lost accuracy against the tests' bound on 1 of
// 20,000 fuzz draws (a bf16 out 2.02e-3 from the float64 reference against a bound of 1.92e-3),
// where the fp32 kernels pass every one.
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/kernels.h"

namespace fmha::cpu {

#if FMHA_CPU_X86
// c[i, j] = sum over p < kp of dot2(a[i * lda + p], b[p * ldb + j]) for i < m, j < n: m a
// multiple of 8, n a multiple of 16. Runs only where selected_isa() is Isa::kAvx512Bf16.
void gemm_bf16_pairs(std::int64_t m, std::int64_t n, std::int64_t kp, const std::uint32_t* a,
                     std::int64_t lda, const std::uint32_t* b, std::int64_t ldb, float* c,
                     std::int64_t ldc);
#endif

// Pairs that hold n bf16 elements (an odd n's last pair half empty).
FMHA_CPU_INLINE std::int64_t pair_count(std::int64_t n) { return (n + 1) / 2; }

// Two bf16 bit patterns as one pair (lo: the even element).
FMHA_CPU_INLINE std::uint32_t bf16_pair(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}

// Reads the n bf16 features of one row (stride apart) as pairs into dst[0], dst[step], ...; an odd
// n's last pair has 0 in its high half.
FMHA_CPU_INLINE void load_bf16_pairs(const Operand& op, std::int64_t offset, std::int64_t n,
                                     std::uint32_t* dst, std::int64_t step) {
  const auto* src = static_cast<const std::uint16_t*>(op.data) + offset;
  const std::int64_t stride = op.feature_stride;
  if (stride == 1 && step == 1) {
    // Contiguous: two neighbouring bf16 are the pair as it lies in (little-endian) memory.
    std::memcpy(dst, src, static_cast<std::size_t>(n / 2) * sizeof(std::uint32_t));
  } else {
    for (std::int64_t p = 0; p < n / 2; ++p)
      dst[p * step] = bf16_pair(src[2 * p * stride], src[(2 * p + 1) * stride]);
  }
  if (n % 2 != 0) dst[n / 2 * step] = bf16_pair(src[(n - 1) * stride], 0);
}

}  // namespace fmha::cpu
