// SIMD building blocks of the fast CPU backend, written with GCC/Clang vector extensions so that
// one source serves every ISA. Each instruction set gets its own copy of the kernels (functions
// marked with a `target` attribute, see kernels.h) into which these helpers are force-inlined, with
// the vector width of its registers: Vec<64> (16 floats) for AVX-512, Vec<32> for AVX2, Vec<16> for
// the portable baseline (SSE2, NEON); shuffles by __builtin_shufflevector (GCC 12 or later, Clang).
// A vector wider than the target's registers has no machine mode and lives in memory (AVX2 ran
// 13x slower on 16-float vectors than on 8-float ones). Nothing here is called out of line, so no
// vector crosses a function boundary.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

// Vectors returned by the inlined helpers trigger GCC's note that the ABI of such values depends on
// the target's vector extensions; they never cross a real call. Arguments go by reference.
#pragma GCC diagnostic ignored "-Wpsabi"

#define FMHA_CPU_INLINE inline __attribute__((always_inline))

namespace fmha::cpu {

// Tiles are padded to multiples of 16 floats, a multiple of every vector width below.
inline constexpr int kLanes = 16;

// The vector types of each width (spelled out: GCC does not take a dependent vector_size).
template <int Bytes>
struct VecTypes;
template <>
struct VecTypes<16> {
  typedef float F __attribute__((vector_size(16)));
  typedef std::int32_t I __attribute__((vector_size(16)));
};
template <>
struct VecTypes<32> {
  typedef float F __attribute__((vector_size(32)));
  typedef std::int32_t I __attribute__((vector_size(32)));
};
template <>
struct VecTypes<64> {
  typedef float F __attribute__((vector_size(64)));
  typedef std::int32_t I __attribute__((vector_size(64)));
};

template <int Bytes>
struct Vec {
  using F = typename VecTypes<Bytes>::F;
  using I = typename VecTypes<Bytes>::I;
  static constexpr int kWidth = Bytes / 4;
  static_assert(kLanes % kWidth == 0, "a 16-float row must be whole vectors");

  static FMHA_CPU_INLINE F load(const float* p) {
    F v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static FMHA_CPU_INLINE void store(float* p, const F& v) { std::memcpy(p, &v, sizeof v); }
  // 32-bit patterns moved as they are (bf16 pairs through transpose()): no arithmetic touches them.
  static FMHA_CPU_INLINE F load_bits(const std::uint32_t* p) {
    F v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static FMHA_CPU_INLINE void store_bits(std::uint32_t* p, const F& v) {
    std::memcpy(p, &v, sizeof v);
  }
  static FMHA_CPU_INLINE F broadcast(float x) { return F{} + x; }
  // Lane-wide copies of *p, read straight from memory: on x86 with AVX (8- and 16-float vectors)
  // one vbroadcastss from memory, which issues as a load. broadcast(*p) costs a scalar add (GCC
  // keeps F{} + x, as 0 + x is not x for x = -0) and a broadcast from a register, which Intel's
  // cores issue on the port of their second 512-bit FMA unit: in the matrix products (kernels.h)
  // 8 such pairs beside 16 FMAs a step left an Intel Xeon core at 35-42% of its FMA peak.
  static FMHA_CPU_INLINE F broadcast_load(const float* p) {
#if defined(__x86_64__)
    if constexpr (kWidth >= 8) {
      F v;
      asm("vbroadcastss %1, %0" : "=v"(v) : "m"(*p));
      return v;
    }
#endif
    return broadcast(*p);
  }
  static FMHA_CPU_INLINE F max(const F& a, const F& b) { return a > b ? a : b; }

  static FMHA_CPU_INLINE float reduce_max(const F& v) {
    float m = v[0];
    for (int i = 1; i < kWidth; ++i) m = v[i] > m ? v[i] : m;
    return m;
  }

  // Sums the lanes in a fixed tree order (for one ISA the same at every call and thread count).
  static FMHA_CPU_INLINE float reduce_sum(const F& lanes) {
    F v = lanes;
    for (int width = kWidth / 2; width >= 1; width /= 2) {
      for (int i = 0; i < width; ++i) v[i] += v[i + width];
    }
    return v[0];
  }

  // exp(x) for x <= 88, relative error about 1 ulp (Cephes' expf: x = n ln2 + r with
  // |r| <= ln2 / 2, a degree-6 polynomial in r, then 2^n through the exponent bits). Results below
  // 2^-126 (x < -87.3) and -inf give exactly 0, which masked scores rely on.
  static FMHA_CPU_INLINE F exp(const F& x) {
    constexpr float kLog2e = 1.44269504088896341f;
    constexpr float kLn2Hi = 0.693359375f;  // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi exact in 9 bits
    constexpr float kLn2Lo = -2.12194440e-4f;
    constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    constexpr float kUnderflow = -87.3f;
    const F clamped = max(x, broadcast(kUnderflow));
    const F n = (clamped * kLog2e + kRoundMagic) - kRoundMagic;
    const F r = (clamped - n * kLn2Hi) - n * kLn2Lo;
    F p = broadcast(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const I exponent = (__builtin_convertvector(n, I) + 127) << 23;
    const F result = p * (F)exponent;  // a vector cast reinterprets the bits
    return x < broadcast(kUnderflow) ? F{} : result;
  }

  // tanh(x) (softcap), within a few ulp: below |x| = 1/4 its odd Taylor series to x^9 (the next
  // term is under 1e-8 of the sum there); above, 1 - 2 / (exp(2 |x|) + 1) with x's sign, whose
  // subtraction loses at most two bits at |x| = 1/4 and fewer above. |x| is clamped to 9 for exp,
  // where tanh is 1 in float already. The scalar std::tanh a score took 5-10x the products of a
  // D 32 score (features suite, softcap 50: 0.5x PyTorch's forward).
  static FMHA_CPU_INLINE F tanh(const F& x) {
    const F zero{}, nine = broadcast(9.0f);
    const F a = x < zero ? -x : x;
    const F z = x * x;
    F poly = broadcast(62.0f / 2835.0f);
    poly = poly * z - 17.0f / 315.0f;
    poly = poly * z + 2.0f / 15.0f;
    poly = poly * z - 1.0f / 3.0f;
    const F series = x + x * z * poly;
    const F clamped = a < nine ? a : nine;
    const F far = 1.0f - 2.0f / (exp(clamped + clamped) + 1.0f);
    return a < broadcast(0.25f) ? series : (x < zero ? -far : far);
  }

  // Transposes the kWidth x kWidth block held by r (row i in r[i]) in place, in log2(kWidth)
  // rounds: round S swaps the off-diagonal S x S blocks of every 2S x 2S block, two two-source
  // shuffles a pair of rows (24 shuffles for 8 x 8, 64 for 16 x 16).
  static FMHA_CPU_INLINE void transpose(F (&r)[kWidth]) {
    transpose_round<1>(r, std::make_integer_sequence<int, kWidth>{});
  }

 private:
  template <int S, int... L>
  static FMHA_CPU_INLINE void transpose_round(F (&r)[kWidth],
                                              std::integer_sequence<int, L...> lanes) {
    for (int i = 0; i < kWidth; ++i) {
      if ((i & S) != 0) continue;
      const F a = r[i], b = r[i + S];
      // Lane l of row i keeps a[l] where bit S of l is clear and takes b[l - S] where it is set;
      // row i + S takes a[l + S] and b[l] alike.
      r[i] = __builtin_shufflevector(a, b, ((L & S) == 0 ? L : kWidth + L - S)...);
      r[i + S] = __builtin_shufflevector(a, b, ((L & S) == 0 ? L + S : kWidth + L)...);
    }
    if constexpr (2 * S < kWidth) transpose_round<2 * S>(r, lanes);
  }
};

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
