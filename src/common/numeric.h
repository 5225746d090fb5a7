// Host-side conversions between float and the 16-bit storage types, round-to-nearest-even.
// Used by the CPU reference and the tests; kernels use the CUDA intrinsics instead.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace fmha::numeric {

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float bf16_to_float(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // keep it a NaN
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline std::uint16_t float_to_fp16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (a >= 65520.0f) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (a < 6.103515625e-05f) {  // subnormal range: quantum 2^-24, round half to even
    const float scaled = a * 16777216.0f;  // exact: power-of-two scaling
    const auto q = static_cast<std::uint16_t>(std::nearbyint(scaled));
    return static_cast<std::uint16_t>(sign | q);
  }
  const std::uint32_t exponent = ((u >> 23) & 0xffu) - 112u;
  std::uint32_t mantissa = u & 0x7fffffu;
  std::uint32_t half = (exponent << 10) | (mantissa >> 13);
  const std::uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // carries into the exponent correctly
  return static_cast<std::uint16_t>(sign | half);
}

}  // namespace fmha::numeric
