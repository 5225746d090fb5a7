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
};

template <typename T>
struct ScoreModifiers {
  float scale_log2, softcap_log2, scale_over_softcap;
  const std::uint16_t* bias;  // already offset to (b, h); nullptr when absent
  std::int64_t bias_row_stride, bias_col_stride;
  const std::uint16_t* rel_h;  // already offset to (b, h); nullptr when absent
  const std::uint16_t* rel_w;
  std::int64_t rel_h_row_stride, rel_h_col_stride, rel_w_row_stride, rel_w_col_stride;
  std::int64_t rel_w_size;
  std::int64_t num_queries, num_keys;

  __device__ static ScoreModifiers make(const ForwardParams& p, std::int64_t b, std::int64_t h,
                                        std::int64_t num_queries, std::int64_t num_keys) {
    ScoreModifiers m;
    m.scale_log2 = p.scale_log2;
    m.softcap_log2 = p.softcap_log2;
    m.scale_over_softcap = p.scale_over_softcap;
    m.bias = p.bias == nullptr ? nullptr
                               : static_cast<const std::uint16_t*>(p.bias) + b * p.bias_stride[0] +
                                     h * p.bias_stride[1];
    m.bias_row_stride = p.bias_stride[2];
    m.bias_col_stride = p.bias_stride[3];
    m.rel_h = p.rel_h == nullptr ? nullptr
                                 : static_cast<const std::uint16_t*>(p.rel_h) +
                                       b * p.rel_h_stride[0] + h * p.rel_h_stride[1];
    m.rel_w = p.rel_w == nullptr ? nullptr
                                 : static_cast<const std::uint16_t*>(p.rel_w) +
                                       b * p.rel_w_stride[0] + h * p.rel_w_stride[1];
    m.rel_h_row_stride = p.rel_h_stride[2];
    m.rel_h_col_stride = p.rel_h_stride[3];
    m.rel_w_row_stride = p.rel_w_stride[2];
    m.rel_w_col_stride = p.rel_w_stride[3];
    m.rel_w_size = p.rel_w_size;
    m.num_queries = num_queries;
    m.num_keys = num_keys;
    return m;
  }

  template <int kTiles>
  __device__ void transform(float (&s)[kTiles][4]) const {
    if (softcap_log2 > 0.0f) {
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] = softcap_log2 * tanhf(s[t][e] * scale_over_softcap);
      }
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
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[t][e] += additive_log2(row + (e >= 2 ? 8 : 0), col + t * 8 + (e & 1));
      }
    }
  }

  // Bias plus rel-pos of (i, j) in log2 units; 0 outside the Lq x Lk grid (rows or keys of a
  // tile past the end, which are never stored or are masked anyway), so nothing reads past a
  // tensor.
  __device__ float additive_log2(std::int64_t i, std::int64_t j) const {
    if (i >= num_queries || j >= num_keys) return 0.0f;
    float add = 0.0f;
    if (bias != nullptr) {
      add += tile::Dtype<T>::to_float(bias[i * bias_row_stride + j * bias_col_stride]);
    }
    if (rel_h != nullptr) {
      const std::int64_t jh = j / rel_w_size;
      const std::int64_t jw = j - jh * rel_w_size;
      add += tile::Dtype<T>::to_float(rel_h[i * rel_h_row_stride + jh * rel_h_col_stride]) +
             tile::Dtype<T>::to_float(rel_w[i * rel_w_row_stride + jw * rel_w_col_stride]);
    }
    return add * kLog2e;
  }
};

}  // namespace fmha::cuda
