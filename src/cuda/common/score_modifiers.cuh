// Score modifiers (SPEC §2): what turns a raw q.k product into the score that enters the softmax.
// Scores are produced in log2 units (score * log2(e)) so that the softmax can use exp2.
//   ScoreScale:     s = scale * q.k                              (one multiply)
//   ScoreModifiers: s = softcap * tanh(scale * q.k / softcap)    when softcap > 0
//                   s += bias[b, h, i, j]                        when a bias is given
//                   s += rel_h[b, h, i, j / Wk] + rel_w[b, h, i, j % Wk]   (SAM, never
//                   materialised)
// Both work on a warp's m16n8 accumulator tiles at once (entries 0, 1 of a thread on `row`, 2, 3 on
// row + 8, entry 0 of tile t at column col + 8t), so each runtime switch is tested once per tile,
// outside the element loops.
// Bias and rel-pos are read straight from global memory at arbitrary int64 strides (0 broadcasts);
// they apply to the Lk ordinary keys only, never to extra keys.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/bias_tiles.cuh"
#include "cuda/common/forward_params.h"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/tile_primitives.cuh"

namespace fmha::cuda {

struct ScoreScale {
  float scale_log2;

  __device__ static ScoreScale make(const ForwardParams& p, std::int64_t, std::int64_t,
                                    std::int64_t, std::int64_t) {
    return {p.scale_log2};
  }
  template <int kTiles>
  __device__ void transform(float (&s)[kTiles][4]) const {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] *= scale_log2;
    }
  }
  template <int kTiles>
  __device__ void add_bias(float (&)[kTiles][4], std::int64_t, std::int64_t) const {}
  __device__ void stage_rel_pos(std::uint16_t*, std::int64_t, int) {}
  template <int kRows, int kCols, int kThreads>
  __device__ void load_bias_tile_async(std::uint32_t, std::int64_t, std::int64_t) const {}
  template <int kTiles>
  __device__ void add_bias_tile(float (&)[kTiles][4], std::int64_t, std::int64_t,
                                const std::uint8_t*, int) const {}
};

// Whether a kernel may fold the plain scale into its exponentials' FMA instead of calling
// transform(): ScoreScale with a positive scale, which keeps the scores' order and -inf as -inf
// (a mask may then hide raw scores). Every other policy transforms first (softcap, bias, rel-pos).
template <typename Scores>
__device__ __forceinline__ bool scale_foldable(const Scores& scores) {
  if constexpr (std::is_same_v<Scores, ScoreScale>) {
    return scores.scale_log2 > 0.0f;
  } else {
    return false;
  }
}

// Softcap's tanh (forward transform and the backward's recomputation alike, so that both see the
// same scores): MUFU.TANH for 16-bit inputs (tanh_approx; about 2^-11 relative, as a 16-bit P
// rounds), tanhf for fp32, which SPEC §13 holds to 1e-5.
template <typename T>
__device__ __forceinline__ float softcap_tanh(float x) {
  if constexpr (sizeof(typename tile::Dtype<T>::Storage) == 2) {
    return tanh_approx(x);
  } else {
    return tanhf(x);
  }
}

// Softcap's transform of a tile of dot products, in place: s = softcap * tanh(scale * s / softcap)
// in log2 units (softcap_log2 = softcap * log2 e), as ScoreSoftcap and ScoreModifiers apply it;
// with softcap_log2 = 1 the tanh alone, as the softcap backward keeps it (backward_policies.cuh).
template <typename T, int kTiles>
__device__ __forceinline__ void apply_softcap(float (&s)[kTiles][4], float softcap_log2,
                                              float scale_over_softcap) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[t][e] = softcap_log2 * softcap_tanh<T>(s[t][e] * scale_over_softcap);
    }
  }
}

// Softcap alone (PolicySoftcap, the sm90 forward): s = softcap * tanh(scale * q.k / softcap) in
// log2 units, as ScoreModifiers computes it, without its bias and rel-pos state; the rest of
// ScoreScale's interface (no bias, nothing staged) as it is.
template <typename T>
struct ScoreSoftcap : ScoreScale {
  float softcap_log2, scale_over_softcap;

  __device__ static ScoreSoftcap make(const ForwardParams& p, std::int64_t, std::int64_t,
                                      std::int64_t, std::int64_t) {
    ScoreSoftcap m;
    m.scale_log2 = p.scale_log2;
    m.softcap_log2 = p.softcap_log2;
    m.scale_over_softcap = p.scale_over_softcap;
    return m;
  }
  template <int kTiles>
  __device__ void transform(float (&s)[kTiles][4]) const {
    apply_softcap<T>(s, softcap_log2, scale_over_softcap);
  }
};

template <typename T>
struct ScoreModifiers {
  using Elem = typename tile::Dtype<T>::Storage;
  // The shared-memory staging (rel-pos rows, bias tiles) packs 16-bit pairs; only the sm90
  // kernels stage, and they are 16-bit only.
  static constexpr bool kCanStage = sizeof(Elem) == 2;
  float scale_log2, softcap_log2, scale_over_softcap;
  const Elem* bias;   // already offset to (b, h); nullptr when absent
  const Elem* rel_h;  // already offset to (b, h); nullptr when absent
  const Elem* rel_w;
  // Strides, Wk and the staging pitch are read in place from the kernel's parameters (constant
  // memory) rather than copied: cold values that would otherwise hold ~20 registers.
  const ForwardParams* params;
  std::int64_t num_queries, num_keys;
  // Rel-pos rows of the block's queries in shared memory (stage_rel_pos), or nullptr.
  const std::uint16_t* rel_staged;
  std::int64_t rel_staged_first_row;
  int rel_h_size;

  __device__ static ScoreModifiers make(const ForwardParams& p, std::int64_t b, std::int64_t h,
                                        std::int64_t num_queries, std::int64_t num_keys) {
    ScoreModifiers m;
    m.scale_log2 = p.scale_log2;
    m.softcap_log2 = p.softcap_log2;
    m.scale_over_softcap = p.scale_over_softcap;
    m.bias = p.bias == nullptr
                 ? nullptr
                 : static_cast<const Elem*>(p.bias) + b * p.bias_stride[0] + h * p.bias_stride[1];
    m.rel_h = p.rel_h == nullptr ? nullptr
                                 : static_cast<const Elem*>(p.rel_h) + b * p.rel_h_stride[0] +
                                       h * p.rel_h_stride[1];
    m.rel_w = p.rel_w == nullptr ? nullptr
                                 : static_cast<const Elem*>(p.rel_w) + b * p.rel_w_stride[0] +
                                       h * p.rel_w_stride[1];
    m.params = &p;
    m.num_queries = num_queries;
    m.num_keys = num_keys;
    m.rel_staged = nullptr;
    m.rel_staged_first_row = 0;
    m.rel_h_size = static_cast<int>((num_keys + p.rel_w_size - 1) / p.rel_w_size);
    return m;
  }

  // Copies the rel_h | rel_w rows of queries [first_row, first_row + rows) to `smem` (row pitch
  // rel_staged_pitch; rel_w starts at an even element), zeros for rows past the sequence, when the
  // launch sized shared memory for it; add_bias then reads them there. Every thread of the block
  // calls it; the caller's next barrier publishes the rows.
  __device__ void stage_rel_pos(std::uint16_t* smem, std::int64_t first_row, int rows) {
    if (rel_h == nullptr || params->rel_staged_pitch == 0) return;
    const int rel_w_offset = (rel_h_size + 1) & ~1;  // even, for 32-bit pair loads
    const int width = rel_w_offset + static_cast<int>(params->rel_w_size);
    for (int index = static_cast<int>(threadIdx.x); index < rows * width;
         index += static_cast<int>(blockDim.x)) {
      const int r = index / width;
      const int c = index % width;
      const std::int64_t i = first_row + r;
      std::uint16_t x = 0;
      if (i < num_queries && c < rel_h_size) {
        x = rel_h[i * params->rel_h_stride[2] + c * params->rel_h_stride[3]];
      } else if (i < num_queries && c >= rel_w_offset) {
        x = rel_w[i * params->rel_w_stride[2] + (c - rel_w_offset) * params->rel_w_stride[3]];
      }
      smem[r * params->rel_staged_pitch + c] = x;
    }
    rel_staged = smem;
    rel_staged_first_row = first_row;
  }

  template <int kTiles>
  __device__ void transform(float (&s)[kTiles][4]) const {
    if (softcap_log2 > 0.0f) {
      apply_softcap<T>(s, softcap_log2, scale_over_softcap);
    } else {
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] *= scale_log2;
      }
    }
  }

  // Adds bias and rel-pos (ordinary keys only; the caller skips extra keys).
  template <int kTiles>
  __device__ void add_bias(float (&s)[kTiles][4], std::int64_t row, std::int64_t col) const {
    if (bias == nullptr && rel_h == nullptr) return;
    if (!kCanStage || rel_staged == nullptr) {
      add_global_additive(s, row, col, /*with_bias=*/true, /*with_rel=*/true);
      return;
    }
    if constexpr (kCanStage) add_staged_rel_pos(s, row, col);
    if (bias != nullptr) add_global_additive(s, row, col, /*with_bias=*/true, /*with_rel=*/false);
  }

  // Copies the bias of query rows [first_row, +kRows) x keys [first_key, +kCols) to shared
  // address `dst` (bias_tiles.cuh), zeros past the sequence; only when the launch set
  // params->bias_staged.
  template <int kRows, int kCols, int kThreads>
  __device__ void load_bias_tile_async(std::uint32_t dst, std::int64_t first_row,
                                       std::int64_t first_key) const {
    bias_tiles::load_async<kRows, kCols, kThreads>(dst, bias, params->bias_stride[2], first_row,
                                                   first_key, num_queries, num_keys);
  }

  // add_bias with the bias read from a staged tile (`tile`, rows local_row and local_row + 8 of
  // it hold this thread's rows; col is the tile-relative column of entry 0): rel-pos as usual.
  template <int kTiles>
  __device__ void add_bias_tile(float (&s)[kTiles][4], std::int64_t row, std::int64_t col,
                                const std::uint8_t* tile, int local_row) const {
    using Convert = tile::Dtype<T>;
    if (rel_h != nullptr) {
      if (rel_staged != nullptr) {
        add_staged_rel_pos(s, row, col);
      } else {
        add_global_additive(s, row, col, /*with_bias=*/false, /*with_rel=*/true);
      }
    }
    constexpr int kRowBytes = kTiles * 16;
    const int c = static_cast<int>(col % 8);  // 2 * (lane % 4)
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int lr = local_row + 8 * r;
        const std::uint32_t w = *reinterpret_cast<const std::uint32_t*>(
            tile + lr * kRowBytes + (bias_tiles::swizzled_chunk<kTiles>(t, lr) << 4) + c * 2);
        s[t][2 * r] += Convert::to_float(static_cast<std::uint16_t>(w)) * kLog2e;
        s[t][2 * r + 1] += Convert::to_float(static_cast<std::uint16_t>(w >> 16)) * kLog2e;
      }
    }
  }

  // The bias of transposed score tiles (the sm90 dK/dV kernel's S^T) from a staged tile of query
  // rows x kCols keys (bias_tiles::add_transposed), added in log2 units.
  template <int kCols, int kTiles>
  __device__ void add_bias_tile_transposed(float (&s)[kTiles][4], std::uint32_t tile, int first_key,
                                           int lane) const {
    bias_tiles::add_transposed<T>(s, bias_tiles::ChunkOf<kCols>{tile}, first_key, lane,
                                  [](float x, float b) { return x + b * kLog2e; });
  }

  // The same read element by element from global memory (bias not staged), on this thread's
  // keys `key`, key + 8 and queries `query` + 8t (+1).
  template <int kTiles>
  __device__ void add_bias_transposed(float (&s)[kTiles][4], std::int64_t key,
                                      std::int64_t query) const {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[t][e] += additive_log2(query + t * 8 + (e & 1), key + (e >= 2 ? 8 : 0),
                                 /*with_bias=*/true, /*with_rel=*/false);
      }
    }
  }

  // Bias and / or rel-pos read from global memory element by element.
  template <int kTiles>
  __device__ void add_global_additive(float (&s)[kTiles][4], std::int64_t row, std::int64_t col,
                                      bool with_bias, bool with_rel) const {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[t][e] +=
            additive_log2(row + (e >= 2 ? 8 : 0), col + t * 8 + (e & 1), with_bias, with_rel);
      }
    }
  }

  // Rel-pos from the staged rows (rel_h padded to an even count, then rel_w): key column
  // j = col + 8t + e sits at grid position (jh, jw), walked incrementally (no division per
  // element); both of this thread's rows share it. col is even (tiles start at even keys), so
  // with an even Wk the pair (j, j + 1) never wraps and rel_w comes as one 32-bit load. Keys past
  // the sequence get nothing (they are masked); rows past it read the staged zeros.
  template <int kTiles>
  __device__ void add_staged_rel_pos(float (&s)[kTiles][4], std::int64_t row,
                                     std::int64_t col) const {
    using Convert = tile::Dtype<T>;
    const int width = static_cast<int>(params->rel_w_size);
    const int rel_w_offset = (rel_h_size + 1) & ~1;
    const std::uint16_t* row0 =
        rel_staged + (row - rel_staged_first_row) * params->rel_staged_pitch;
    const std::uint16_t* row8 = row0 + 8 * params->rel_staged_pitch;
    const int first = static_cast<int>(col);
    int jh = first / width;
    int jw = first - jh * width;
    if (width % 2 == 0) {
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        if (first + t * 8 < num_keys) {
          const float h0 = Convert::to_float(row0[jh]);
          const float h8 = Convert::to_float(row8[jh]);
          const std::uint32_t w0 =
              *reinterpret_cast<const std::uint32_t*>(row0 + rel_w_offset + jw);
          const std::uint32_t w8 =
              *reinterpret_cast<const std::uint32_t*>(row8 + rel_w_offset + jw);
          s[t][0] += (h0 + Convert::to_float(static_cast<std::uint16_t>(w0))) * kLog2e;
          s[t][1] += (h0 + Convert::to_float(static_cast<std::uint16_t>(w0 >> 16))) * kLog2e;
          s[t][2] += (h8 + Convert::to_float(static_cast<std::uint16_t>(w8))) * kLog2e;
          s[t][3] += (h8 + Convert::to_float(static_cast<std::uint16_t>(w8 >> 16))) * kLog2e;
        }
        jw += 8;
        while (jw >= width) jw -= width, ++jh;
      }
      return;
    }
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        int h = jh, w = jw + e;
        if (w >= width) w -= width, ++h;
        if (first + t * 8 + e < num_keys) {
          s[t][e] +=
              (Convert::to_float(row0[h]) + Convert::to_float(row0[rel_w_offset + w])) * kLog2e;
          s[t][2 + e] +=
              (Convert::to_float(row8[h]) + Convert::to_float(row8[rel_w_offset + w])) * kLog2e;
        }
      }
      jw += 8;
      while (jw >= width) jw -= width, ++jh;
    }
  }

  // Bias plus rel-pos of (i, j) in log2 units; 0 outside the Lq x Lk grid (rows or keys of a
  // tile past the end, which are never stored or are masked anyway), so nothing reads past a
  // tensor.
  // with_bias / with_rel leave out a term that the caller adds from shared memory.
  __device__ float additive_log2(std::int64_t i, std::int64_t j, bool with_bias = true,
                                 bool with_rel = true) const {
    if (i >= num_queries || j >= num_keys) return 0.0f;
    float add = 0.0f;
    if (with_bias && bias != nullptr) {
      add +=
          tile::Dtype<T>::to_float(bias[i * params->bias_stride[2] + j * params->bias_stride[3]]);
    }
    if (with_rel && rel_h != nullptr) {
      const std::int64_t jh = j / params->rel_w_size;
      const std::int64_t jw = j - jh * params->rel_w_size;
      add += tile::Dtype<T>::to_float(
                 rel_h[i * params->rel_h_stride[2] + jh * params->rel_h_stride[3]]) +
             tile::Dtype<T>::to_float(
                 rel_w[i * params->rel_w_stride[2] + jw * params->rel_w_stride[3]]);
    }
    return add * kLog2e;
  }
};

}  // namespace fmha::cuda
