// SIMD building blocks of the fast CPU backend: a 16-lane float vector written with GCC/Clang
// vector extensions, so one source serves every ISA. Each instruction set gets its own copy of the
// kernels (functions marked with a `target` attribute, see kernels.h) into which these helpers are
// force-inlined; there a 16-lane vector is one AVX-512 register, two AVX2 registers, four SSE or
// NEON registers. Nothing here is called out of line, so no vector crosses a function boundary.
#pragma once

#include <cstdint>
#include <cstring>

// Vectors of 64 bytes passed between inlined helpers trigger GCC's note that the ABI of such
// arguments depends on -mavx512f; they never cross a real call.
#pragma GCC diagnostic ignored "-Wpsabi"

#define FMHA_CPU_INLINE inline __attribute__((always_inline))

namespace fmha::cpu {

inline constexpr int kLanes = 16;

typedef float VecF __attribute__((vector_size(64)));
typedef std::int32_t VecI __attribute__((vector_size(64)));

FMHA_CPU_INLINE VecF load(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

FMHA_CPU_INLINE void store(float* p, VecF v) {
  std::memcpy(p, &v, sizeof v);
}

FMHA_CPU_INLINE VecF broadcast(float x) {
  return VecF{} + x;
}

FMHA_CPU_INLINE VecF max(VecF a, VecF b) {
  return a > b ? a : b;
}

FMHA_CPU_INLINE float reduce_max(VecF v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// Sums the lanes in a fixed tree order (the same on every ISA and thread count).
FMHA_CPU_INLINE float reduce_sum(VecF v) {
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int i = 0; i < width; ++i) v[i] += v[i + width];
  }
  return v[0];
}

// exp(x) for x <= 88, relative error about 1 ulp (Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2,
// a degree-6 polynomial in r, then 2^n through the exponent bits). Results below 2^-126 (x < -87.3)
// and -inf give exactly 0, which masked scores rely on.
FMHA_CPU_INLINE VecF exp(VecF x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi exact in 9 bits
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float kUnderflow = -87.3f;
  const VecF clamped = max(x, broadcast(kUnderflow));
  const VecF n = (clamped * kLog2e + kRoundMagic) - kRoundMagic;
  const VecF r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  VecF p = broadcast(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const VecI exponent = (__builtin_convertvector(n, VecI) + 127) << 23;
  const VecF result = p * (VecF)exponent;  // a vector cast reinterprets the bits
  return x < broadcast(kUnderflow) ? VecF{} : result;
}

// fp16 / bf16 bits to float, branch-free so that the conversion loops vectorise.
FMHA_CPU_INLINE float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t magnitude = h & 0x7fffu;
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  // Shifted into a float's exponent and mantissa, a half is its value times 2^-112; the multiply
  // restores it, subnormals included. Infinity and NaN (exponent 31) take the float's top exponent.
  float scaled;
  const std::uint32_t shifted = magnitude << 13;
  std::memcpy(&scaled, &shifted, sizeof scaled);
  scaled *= 0x1p112f;
  std::uint32_t bits;
  std::memcpy(&bits, &scaled, sizeof bits);
  if (magnitude >= 0x7c00u) bits = shifted | 0x7f800000u;
  bits |= sign;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

FMHA_CPU_INLINE float bf16_bits_to_float(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace fmha::cpu
