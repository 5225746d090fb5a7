// The dtype-generic tensor-core operand layer of the sm80 mainloops: one mainloop per direction
// serves fp16/bf16 (mma m16n8k16) and fp32 (mma m16n8k8 on tf32) because both are written in
// k-steps of 32 bytes of a shared-memory row: 16 elements of a 16-bit type, 8 floats.
//
// A fragment (Frag) holds one k-step of an A operand (16 rows) or of a B operand (two n8 tiles).
// Loads:
//   load_rows:  A, or B with n along the shared rows (K in Q K^T): ldmatrix .x4 .b16. On a
//               row-major fp32 tile a 16-bit 8x8 matrix is an 8x4-float matrix, and the lane that
//               receives word c of row g holds element (g, c): exactly the tf32 A/B fragments, so
//               the 16-bit lane addresses (in bytes) serve both.
//   load_b_cols: B with k along the shared rows (V in P V): ldmatrix .trans for 16-bit types;
//               fp32 has no transposing load, so four 32-bit loads per lane.
//   load_a_cols: A with k along the shared rows (dS from a staged dS^T), likewise.
//   from_accumulators: A from the fp32 accumulators of a previous product (P, dS).
// For fp32 the k index of a step is permuted (the products sum over k, so any permutation that A
// and B share is exact): k-slot c holds key 2c and slot c + 4 key 2c + 1 of the step's 8, which
// makes the accumulator pairs (g, 2c), (g, 2c + 1) the A registers a0 and a2 with no data
// movement, and the column loads use the same order. ldmatrix-fed operands keep the natural order;
// they never meet an accumulator-fed or column-loaded operand in one product.
//
// fp32 products: with kSplit ("3xTF32", SPEC §13 exact mode) each operand x is split into
// hi = x rounded to the nearest tf32 and lo = x - hi (exact in fp32, |lo| <= 2^-11 |x|; the
// tensor cores read its top 11 significant bits), and d += lo*hi + hi*lo + hi*hi: the dropped
// lo*lo and lo's truncation are at most about 2^-21 of each product, with no systematic sign, far
// under the 1e-5 bound. Without kSplit (allow_tf32) one product of the operands rounded to tf32.
// Splitting happens once per fragment load, so a fragment that feeds several products is split
// once.
#pragma once

#include <cstdint>

#include "cuda/common/tile_primitives.cuh"

namespace fmha::cuda::tile {

template <typename T>
inline constexpr bool kIsFloat = sizeof(typename Dtype<T>::Storage) == 4;

// Elements of a 16-byte chunk (one cp.async, one ldmatrix row) and of one k-step (32 bytes of a
// row).
template <typename T>
inline constexpr int kChunk = 16 / static_cast<int>(sizeof(typename Dtype<T>::Storage));
template <typename T>
inline constexpr int kStepK = 32 / static_cast<int>(sizeof(typename Dtype<T>::Storage));

template <typename T, bool kSplit>
struct Frag {
  std::uint32_t x[4];
};
template <>
struct Frag<float, true> {
  std::uint32_t x[4];   // hi parts after split()
  std::uint32_t lo[4];  // x - hi
};

// x rounded to the nearest tf32 (ties away from zero), as fp32 bits: adding half a tf32 ulp to the
// bit pattern carries into the kept bits exactly when the dropped ones are at least half of it
// (a carry out of the mantissa correctly bumps the exponent). Two integer operations.
__device__ __forceinline__ std::uint32_t round_to_tf32(std::uint32_t x) {
  return (x + 0x1000u) & 0xffffe000u;
}

// Prepares a freshly loaded fp32 fragment for the products: rounds it to tf32, and with kSplit
// also keeps the remainder. A no-op for 16-bit types.
template <typename T, bool kSplit>
__device__ __forceinline__ void split(Frag<T, kSplit>& f) {
  if constexpr (kIsFloat<T>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const std::uint32_t hi = round_to_tf32(f.x[i]);
      if constexpr (kSplit) {
        f.lo[i] = __float_as_uint(__uint_as_float(f.x[i]) - __uint_as_float(hi));
      }
      f.x[i] = hi;
    }
  }
}

// A fragment (or B fragment of two n8 tiles, k along the row) at this lane's ldmatrix address.
template <typename T, bool kSplit>
__device__ __forceinline__ void load_rows(Frag<T, kSplit>& f, std::uint32_t address) {
  ldmatrix_x4(f.x, address);
  split(f);
}

// Lane offsets (elements) of the column loads inside a [k rows][n columns] tile of pitch kPitch.
// 16-bit B: ldmatrix.trans matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
// (k 8-15, n 8-15). fp32 B and A: this lane's k rows 2c, 2c + 1 at column g.
template <typename T, int kPitch>
__device__ __forceinline__ int b_cols_lane_offset(int lane) {
  if constexpr (kIsFloat<T>) {
    return 2 * (lane % 4) * kPitch + lane / 4;
  } else {
    return (((lane / 8) % 2) * 8 + lane % 8) * kPitch + (lane / 16) * 8;
  }
}
// 16-bit A from a [k][m] tile through ldmatrix.trans: matrix i covers k rows 8 * (i / 2) on and
// m columns 8 * (i % 2) on.
template <typename T, int kPitch>
__device__ __forceinline__ int a_cols_lane_offset(int lane) {
  if constexpr (kIsFloat<T>) {
    return 2 * (lane % 4) * kPitch + lane / 4;
  } else {
    const int mat = lane / 8;
    return ((mat / 2) * 8 + lane % 8) * kPitch + (mat % 2) * 8;
  }
}

// The four words of an fp32 B fragment from a tile whose rows are k (load_b_cols's order: rows
// 2c, 2c + 1 of column g, then of column g + 8).
template <int kPitch>
__device__ __forceinline__ void load_b_col_words(std::uint32_t (&x)[4], std::uint32_t address) {
  constexpr std::uint32_t kRow = kPitch * 4, kCol8 = 8 * 4;
  x[0] = ld_shared_b32(address);
  x[1] = ld_shared_b32(address + kRow);
  x[2] = ld_shared_b32(address + kCol8);
  x[3] = ld_shared_b32(address + kRow + kCol8);
}

// B fragment of two n8 tiles (n columns 0-15 of the tile) from a tile whose rows are k.
template <typename T, int kPitch, bool kSplit>
__device__ __forceinline__ void load_b_cols(Frag<T, kSplit>& f, std::uint32_t address) {
  if constexpr (kIsFloat<T>) {
    load_b_col_words<kPitch>(f.x, address);
    split(f);
  } else {
    ldmatrix_x4_trans(f.x, address);
  }
}

// A fragment (m rows 0-15) from a tile whose rows are k (the transposed A operand).
template <typename T, int kPitch, bool kSplit>
__device__ __forceinline__ void load_a_cols(Frag<T, kSplit>& f, std::uint32_t address) {
  if constexpr (kIsFloat<T>) {
    constexpr std::uint32_t kRow = kPitch * 4, kCol8 = 8 * 4;
    f.x[0] = ld_shared_b32(address);
    f.x[1] = ld_shared_b32(address + kCol8);
    f.x[2] = ld_shared_b32(address + kRow);
    f.x[3] = ld_shared_b32(address + kRow + kCol8);
    split(f);
  } else {
    ldmatrix_x4_trans(f.x, address);
  }
}

// A fragment of k-step `step` from m16n8 accumulators whose columns are the k index.
// Stores the accumulator pair (row, col), (row, col + 1) (col even) to shared memory.
template <typename T>
__device__ __forceinline__ void store_pair(typename Dtype<T>::Storage* dst, float a, float b) {
  if constexpr (kIsFloat<T>) {
    *reinterpret_cast<float2*>(dst) = make_float2(a, b);
  } else {
    *reinterpret_cast<std::uint32_t*>(dst) = Dtype<T>::pack(a, b);
  }
}

template <typename T, bool kSplit, int kTiles>
__device__ __forceinline__ void from_accumulators(Frag<T, kSplit>& f, const float (&s)[kTiles][4],
                                                  int step) {
  if constexpr (kIsFloat<T>) {
    f.x[0] = __float_as_uint(s[step][0]);
    f.x[1] = __float_as_uint(s[step][2]);
    f.x[2] = __float_as_uint(s[step][1]);
    f.x[3] = __float_as_uint(s[step][3]);
    split(f);
  } else {
    f.x[0] = Dtype<T>::pack(s[2 * step][0], s[2 * step][1]);
    f.x[1] = Dtype<T>::pack(s[2 * step][2], s[2 * step][3]);
    f.x[2] = Dtype<T>::pack(s[2 * step + 1][0], s[2 * step + 1][1]);
    f.x[3] = Dtype<T>::pack(s[2 * step + 1][2], s[2 * step + 1][3]);
  }
}

// d += a * b over one k-step for n8 tile `half` (0 or 1) of the B fragment.
template <typename T, bool kSplit>
__device__ __forceinline__ void mma(float (&d)[4], const Frag<T, kSplit>& a,
                                    const Frag<T, kSplit>& b, int half) {
  if constexpr (kIsFloat<T>) {
    if constexpr (kSplit) {
      // The tensor cores add into their accumulator with truncation (round toward zero), so three
      // products a k-step added straight into the running sum bias it by about 3 ulps of the sum
      // per step: a relative error that grows with the depth (L keys for P V). The step's products
      // go to a zeroed fragment and reach the sum through a rounded fp32 add.
      float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_m16n8k8_tf32(t, a.lo, b.x[2 * half], b.x[2 * half + 1]);
      mma_m16n8k8_tf32(t, a.x, b.lo[2 * half], b.lo[2 * half + 1]);
      mma_m16n8k8_tf32(t, a.x, b.x[2 * half], b.x[2 * half + 1]);
#pragma unroll
      for (int i = 0; i < 4; ++i) d[i] += t[i];
    } else {
      mma_m16n8k8_tf32(d, a.x, b.x[2 * half], b.x[2 * half + 1]);
    }
  } else {
    mma_m16n8k16<T>(d, a.x, b.x[2 * half], b.x[2 * half + 1]);
  }
}

// Tiles split once where they are staged (exact mode): a block whose tile feeds many fragment
// loads (the dK/dV kernel's K and V, read again at every query step) splits it in place after its
// copy lands, hi over x and lo in a plane `lo_offset` bytes on, and its loads then take both
// parts with no arithmetic: two ldmatrix, or eight 32-bit loads for the column form.
//
// Splits rows [0, kRows) x columns [0, kCols) of a [kRows][kPitch] fp32 tile, 16 bytes a thread
// at a time; the caller's barrier publishes it.
template <int kRows, int kCols, int kPitch, int kThreads>
__device__ __forceinline__ void split_tile_in_place(float* tile, int lo_offset_bytes) {
  static_assert(kCols % 4 == 0 && kPitch % 4 == 0, "16-byte chunks");
  constexpr int kChunksPerRow = kCols / 4;
  for (int i = static_cast<int>(threadIdx.x); i < kRows * kChunksPerRow; i += kThreads) {
    float* const at = tile + (i / kChunksPerRow) * kPitch + (i % kChunksPerRow) * 4;
    const float4 x = *reinterpret_cast<const float4*>(at);
    Frag<float, true> f;
    f.x[0] = __float_as_uint(x.x);
    f.x[1] = __float_as_uint(x.y);
    f.x[2] = __float_as_uint(x.z);
    f.x[3] = __float_as_uint(x.w);
    split(f);
    *reinterpret_cast<float4*>(at) = make_float4(__uint_as_float(f.x[0]), __uint_as_float(f.x[1]),
                                                 __uint_as_float(f.x[2]), __uint_as_float(f.x[3]));
    *reinterpret_cast<float4*>(reinterpret_cast<std::uint8_t*>(at) + lo_offset_bytes) =
        make_float4(__uint_as_float(f.lo[0]), __uint_as_float(f.lo[1]), __uint_as_float(f.lo[2]),
                    __uint_as_float(f.lo[3]));
  }
}

// load_rows from a tile split in place.
__device__ __forceinline__ void load_rows_presplit(Frag<float, true>& f, std::uint32_t address,
                                                   std::uint32_t lo_offset_bytes) {
  ldmatrix_x4(f.x, address);
  ldmatrix_x4(f.lo, address + lo_offset_bytes);
}

// load_b_cols from a tile split in place.
template <int kPitch>
__device__ __forceinline__ void load_b_cols_presplit(Frag<float, true>& f, std::uint32_t address,
                                                     std::uint32_t lo_offset_bytes) {
  load_b_col_words<kPitch>(f.x, address);
  load_b_col_words<kPitch>(f.lo, address + lo_offset_bytes);
}

// k-steps that a product whose accumulator starts at zero (S, dP, a tile's partial dQ) may add
// straight into it in exact mode: each step adds three truncated sums at the accumulator's own
// magnitude, so 8 steps (a depth of 64 floats) bound the bias to 24 ulps of the product (1.4e-6
// relative, about half that on average), far under SPEC §13's 1e-5. Deeper products, and running
// sums over many tiles (O, dK, dV, the dQ kernel's dQ), take mma's rounded step sums.
inline constexpr int kDirectSteps = 8;

// d += a * b like mma, for an accumulator zeroed before this product's first of kSteps k-steps:
// with kSteps <= kDirectSteps the exact mode's three products go straight into d (no zeroed
// fragment, no rounded adds, no dependent add after each step).
template <int kSteps, typename T, bool kSplit>
__device__ __forceinline__ void mma_fresh(float (&d)[4], const Frag<T, kSplit>& a,
                                          const Frag<T, kSplit>& b, int half) {
  if constexpr (kIsFloat<T> && kSplit && kSteps <= kDirectSteps) {
    mma_m16n8k8_tf32(d, a.lo, b.x[2 * half], b.x[2 * half + 1]);
    mma_m16n8k8_tf32(d, a.x, b.lo[2 * half], b.lo[2 * half + 1]);
    mma_m16n8k8_tf32(d, a.x, b.x[2 * half], b.x[2 * half + 1]);
  } else {
    mma(d, a, b, half);
  }
}

}  // namespace fmha::cuda::tile
