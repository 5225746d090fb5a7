// The pieces the fast CPU kernels are built from: instruction-set traits, the register-blocked
// matrix product, and conversions between the tensors' dtypes and fp32 tiles.
//
// Every kernel is a template on an ISA traits struct, force-inlined into one wrapper per
// instruction set that carries a GCC `target` attribute (AVX-512, AVX2 + FMA, and the portable
// baseline, which is also what Arm and other machines build). dispatch picks the wrapper the CPU
// supports at run time. Nothing with a target attribute is inline in a header, so no ODR-merged
// function can carry instructions the running CPU lacks.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/numeric.h"
#include "cpu/problem.h"
#include "cpu/simd.h"

#if defined(__x86_64__) || defined(__i386__)
#define FMHA_CPU_X86 1
#define FMHA_CPU_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define FMHA_CPU_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))
#define FMHA_CPU_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,avx2,fma,f16c")))
#else
#define FMHA_CPU_X86 0
#endif

namespace fmha::cpu {

// kAvx512Bf16: AVX-512 with its bf16 dot product (vdpbf16ps), which the kernels use for products
// of two bf16 tensors (S = Q K^T and dP = dO V^T of bf16 inputs); every other product runs as
// under kAvx512.
enum class Isa : std::uint8_t { kPortable, kAvx2, kAvx512, kAvx512Bf16 };

// The best ISA this CPU runs, lowered by FMHA_CPU_ISA=portable|avx2|avx512|avx512bf16 (tests use
// it to run every variant on one machine; a request above the CPU's support is ignored). avx512bf16
// is the default on AMD's cores only, where the bf16 dot product pays (backend.cpp: bf16_dot_pays);
// FMHA_CPU_ISA=avx512bf16 selects it wherever the CPU has it.
Isa selected_isa();
const char* to_string(Isa isa);

// Per ISA: the vector type, and the register block of the matrix product, kRows rows by kChunks
// 16-float chunks of accumulators. AVX-512 has 32 registers of 16 floats: 8 x 2 accumulators leave
// room for the two B vectors and a broadcast. AVX2 has 16 of 8: 4 x 1 chunk is 8 registers. SSE2
// has 16 of 4 (NEON 32): 2 x 1 chunk is 8.
struct PortableTraits {
  using V = Vec<16>;
  static constexpr int kRows = 2, kChunks = 1;
};
struct Avx2Traits {
  using V = Vec<32>;
  static constexpr int kRows = 4, kChunks = 1;
};
struct Avx512Traits {
  using V = Vec<64>;
  static constexpr int kRows = 8, kChunks = 2;
};

// Tile sizes shared by every ISA: queries and keys per tile. Both are multiples of 16 (a key tile
// is a row of vectors) and of every kRows (tiles are products' row counts). 64 x 64 keeps a
// tile's fp32 scores, the Q tile and the K / V tiles of D 64 within a core's L2 with room to spare.
inline constexpr std::int64_t kQueryTile = 64;
inline constexpr std::int64_t kKeyTile = 64;

FMHA_CPU_INLINE std::int64_t round_up(std::int64_t x, std::int64_t m) {
  return (x + m - 1) / m * m;
}

// C[m, n] (+)= A[m, k] B[k, n] for one register block of R rows and C 16-float chunks, in vectors
// of V. A is read one element at a time with any strides (a_row between rows, a_col between
// columns), so a transposed operand costs nothing; B is row-major with leading dimension ldb.
template <typename V, int R, int C>
FMHA_CPU_INLINE void gemm_block(std::int64_t k, const float* a, std::int64_t a_row,
                                std::int64_t a_col, const float* b, std::int64_t ldb, float* c,
                                std::int64_t ldc, bool accumulate) {
  constexpr int N = C * kLanes / V::kWidth;  // vectors a row
  typename V::F acc[R][N];
  for (int r = 0; r < R; ++r) {
    for (int x = 0; x < N; ++x)
      acc[r][x] = accumulate ? V::load(c + r * ldc + x * V::kWidth) : typename V::F{};
  }
  for (std::int64_t p = 0; p < k; ++p) {
    typename V::F bv[N];
    for (int x = 0; x < N; ++x) bv[x] = V::load(b + p * ldb + x * V::kWidth);
    const float* ap = a + p * a_col;
    for (int r = 0; r < R; ++r) {
      const typename V::F av = V::broadcast_load(ap + r * a_row);
      for (int x = 0; x < N; ++x) acc[r][x] += av * bv[x];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int x = 0; x < N; ++x) V::store(c + r * ldc + x * V::kWidth, acc[r][x]);
  }
}

// C[m, n] (+)= A[m, k] B[k, n]; m a multiple of Traits::kRows, n a multiple of 16.
template <typename Traits>
FMHA_CPU_INLINE void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                          std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t ldb,
                          float* c, std::int64_t ldc, bool accumulate) {
  constexpr int R = Traits::kRows, C = Traits::kChunks;
  for (std::int64_t i = 0; i < m; i += R) {
    const float* ai = a + i * a_row;
    float* ci = c + i * ldc;
    std::int64_t j = 0;
    for (; j + C * kLanes <= n; j += C * kLanes)
      gemm_block<typename Traits::V, R, C>(k, ai, a_row, a_col, b + j, ldb, ci + j, ldc,
                                           accumulate);
    for (; j < n; j += kLanes)
      gemm_block<typename Traits::V, R, 1>(k, ai, a_row, a_col, b + j, ldb, ci + j, ldc,
                                           accumulate);
  }
}

// Reads n features (stride `stride` apart) of one row of a tensor as fp32 times `scale`, into
// dst[0], dst[step], ... (step 1: a row of a tile; step ld: a column of a transposed tile).
FMHA_CPU_INLINE void load_features(const Operand& op, std::int64_t offset, std::int64_t n,
                                   float scale, float* dst, std::int64_t step) {
  const std::int64_t stride = op.feature_stride;
  switch (op.dtype) {
    case DType::kFloat32: {
      const float* src = static_cast<const float*>(op.data) + offset;
      for (std::int64_t d = 0; d < n; ++d) dst[d * step] = src[d * stride] * scale;
      return;
    }
    case DType::kBFloat16: {
      const auto* src = static_cast<const std::uint16_t*>(op.data) + offset;
      for (std::int64_t d = 0; d < n; ++d)
        dst[d * step] = bf16_bits_to_float(src[d * stride]) * scale;
      return;
    }
    case DType::kFloat16: {
      const auto* src = static_cast<const std::uint16_t*>(op.data) + offset;
      for (std::int64_t d = 0; d < n; ++d)
        dst[d * step] = half_bits_to_float(src[d * stride]) * scale;
      return;
    }
    case DType::kFloat64:
    case DType::kInt32:
      break;  // never dispatched here (backend.cpp keeps the fast backend to fp32 / fp16 / bf16)
  }
  for (std::int64_t d = 0; d < n; ++d) dst[d * step] = 0.0f;
}

// Writes n values src[d] * scale, rounded to the nearest value of the tensor's dtype.
FMHA_CPU_INLINE void store_features(const Operand& op, std::int64_t offset, std::int64_t n,
                                    const float* src, float scale) {
  const std::int64_t stride = op.feature_stride;
  switch (op.dtype) {
    case DType::kFloat32: {
      float* dst = static_cast<float*>(op.data) + offset;
      for (std::int64_t d = 0; d < n; ++d) dst[d * stride] = src[d] * scale;
      return;
    }
    case DType::kBFloat16: {
      auto* dst = static_cast<std::uint16_t*>(op.data) + offset;
      for (std::int64_t d = 0; d < n; ++d) dst[d * stride] = numeric::float_to_bf16(src[d] * scale);
      return;
    }
    case DType::kFloat16: {
      auto* dst = static_cast<std::uint16_t*>(op.data) + offset;
      for (std::int64_t d = 0; d < n; ++d) dst[d * stride] = numeric::float_to_fp16(src[d] * scale);
      return;
    }
    case DType::kFloat64:
    case DType::kInt32:
      return;
  }
}

// One element of an fp32 / bf16 / fp16 tensor as fp32.
FMHA_CPU_INLINE float load_element(const void* data, DType dtype, std::int64_t offset) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(data)[offset];
    case DType::kBFloat16:
      return bf16_bits_to_float(static_cast<const std::uint16_t*>(data)[offset]);
    case DType::kFloat16:
      return half_bits_to_float(static_cast<const std::uint16_t*>(data)[offset]);
    case DType::kFloat64:
    case DType::kInt32:
      break;  // never dispatched here
  }
  return 0.0f;
}

// row[0 .. n) += term elements offset, offset + stride[3], ... (the dtype dispatched once).
FMHA_CPU_INLINE void add_strided(const ScoreTerm& t, std::int64_t offset, std::int64_t n,
                                 float* row) {
  const std::int64_t step = t.stride[3];
  switch (t.dtype) {
    case DType::kFloat32: {
      const float* src = static_cast<const float*>(t.data) + offset;
      for (std::int64_t j = 0; j < n; ++j) row[j] += src[j * step];
      return;
    }
    case DType::kBFloat16: {
      const auto* src = static_cast<const std::uint16_t*>(t.data) + offset;
      for (std::int64_t j = 0; j < n; ++j) row[j] += bf16_bits_to_float(src[j * step]);
      return;
    }
    case DType::kFloat16: {
      const auto* src = static_cast<const std::uint16_t*>(t.data) + offset;
      for (std::int64_t j = 0; j < n; ++j) row[j] += half_bits_to_float(src[j * step]);
      return;
    }
    case DType::kFloat64:
    case DType::kInt32:
      return;  // never dispatched here
  }
}

// Writes row[0 .. n) to term elements offset, offset + stride[3], ..., rounded to the term's dtype.
FMHA_CPU_INLINE void store_strided(const ScoreTerm& t, std::int64_t offset, std::int64_t n,
                                   const float* row) {
  const std::int64_t step = t.stride[3];
  switch (t.dtype) {
    case DType::kFloat32: {
      float* dst = static_cast<float*>(t.data) + offset;
      for (std::int64_t j = 0; j < n; ++j) dst[j * step] = row[j];
      return;
    }
    case DType::kBFloat16: {
      auto* dst = static_cast<std::uint16_t*>(t.data) + offset;
      for (std::int64_t j = 0; j < n; ++j) dst[j * step] = numeric::float_to_bf16(row[j]);
      return;
    }
    case DType::kFloat16: {
      auto* dst = static_cast<std::uint16_t*>(t.data) + offset;
      for (std::int64_t j = 0; j < n; ++j) dst[j * step] = numeric::float_to_fp16(row[j]);
      return;
    }
    case DType::kFloat64:
    case DType::kInt32:
      return;  // never dispatched here
  }
}

// The additive score terms of query i (batch b, head h) over keys k0 .. k0 + cols - 1: the bias and
// SAM's rel-pos (SPEC §2), added to row[0 .. cols).
FMHA_CPU_INLINE void add_score_terms(const Call& c, std::int64_t b, std::int64_t h, std::int64_t i,
                                     std::int64_t k0, std::int64_t cols, float* row) {
  if (c.bias.given()) {
    add_strided(c.bias, c.bias.row(b, h, i) + k0 * c.bias.stride[3], cols, row);
  }
  if (c.rel_h.given()) {
    // Key k0 + j sits at grid column kw = (k0 + j) % Wk of grid row kh: walk both without a
    // division a key. rel_w's row is the same for every grid row, rel_h's one value per grid row.
    const std::int64_t wk = c.rel_w_size;
    std::int64_t kh = k0 / wk, kw = k0 % wk, j = 0;
    const std::int64_t h_row = c.rel_h.row(b, h, i), w_row = c.rel_w.row(b, h, i);
    while (j < cols) {
      const std::int64_t run = std::min(wk - kw, cols - j);
      const float rh = load_element(c.rel_h.data, c.rel_h.dtype, h_row + kh * c.rel_h.stride[3]);
      for (std::int64_t x = 0; x < run; ++x) row[j + x] += rh;
      add_strided(c.rel_w, w_row + kw * c.rel_w.stride[3], run, row + j);
      j += run, ++kh, kw = 0;
    }
  }
}

// One fp32 statistic (lse, dlse, sinks, dsinks); their validation fixes the dtype to fp32 for the
// dtypes this backend takes.
FMHA_CPU_INLINE float load_stat(const Operand& op, std::int64_t offset) {
  return static_cast<const float*>(op.data)[offset];
}
FMHA_CPU_INLINE void store_stat(const Operand& op, std::int64_t offset, float value) {
  static_cast<float*>(op.data)[offset] = value;
}

}  // namespace fmha::cpu
