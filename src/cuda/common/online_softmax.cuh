// Online softmax over key tiles (the FlashAttention recurrence), for the two rows a thread owns
// in m16n8 accumulator fragments (rows g and g + 8 of its warp's 16).
//
// Scores arrive in log2 units (log2(e) is folded into the scale by the score modifiers), so the
// exponentials are single exp2 instructions. A hidden score is -inf. Until a row has seen a
// visible key its running max is -inf; the exponent base then falls back to 0 so that
// (-inf) - (-inf) never produces NaN, and the row's sum and output simply stay 0.
#pragma once

#include <cmath>

namespace fmha::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// exp2 on the multi-function unit alone. exp2f compiles to ex2.approx.f32, whose denormal-result
// handling adds a compare and two predicated multiplies around every MUFU.EX2 (seen in the SASS);
// flushing results below 2^-126 to zero changes no probability that a 16-bit P could hold.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// tanh on the multi-function unit alone (MUFU.TANH, sm_75 and later): relative error about 2^-11,
// where tanhf takes some twenty instructions around two MUFU operations for about 2 ulp. Softcap
// of 16-bit inputs uses it (score_modifiers.cuh: softcap_tanh): its scores come from 16-bit
// products and its probabilities are rounded to 16 bits, errors of the same size.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Reductions over the 4 lanes of a quad (the lanes that share a fragment row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

struct OnlineSoftmax {
  float row_max[2];  // running max of the scores (log2 units), per owned row
  float row_sum[2];  // running sum of exp2(score - row_max), this thread's columns only

  __device__ __forceinline__ void init() {
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
  }

  // Turns a tile of scores into unnormalised probabilities in place and rescales the output
  // accumulator `o` to the new running max. kLazyRescale: `o` is rescaled only when the max of a
  // row of the warp that has seen a key changed (a warp vote: the whole warp calls update); decode,
  // whose maxima settle after a few tiles, then skips most of the multiplies. kFlushDenormals: the
  // exponentials by exp2_ftz (one MUFU.EX2 each, where exp2f adds three instructions).
  template <bool kLazyRescale = false, bool kFlushDenormals = false, int kScoreTiles,
            int kOutTiles>
  __device__ __forceinline__ void update(float (&s)[kScoreTiles][4], float (&o)[kOutTiles][4]) {
    auto exp2 = [](float x) { return kFlushDenormals ? exp2_ftz(x) : exp2f(x); };
    float rescales[2];
    bool changed = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) {
        tile_max = fmaxf(tile_max, fmaxf(s[t][2 * r], s[t][2 * r + 1]));
      }
      const float new_max = fmaxf(row_max[r], quad_max(tile_max));
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      const float rescale = exp2(row_max[r] - base);
      changed = changed || (row_max[r] != -INFINITY && new_max != row_max[r]);
      row_max[r] = new_max;
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) {
        s[t][2 * r] = exp2(s[t][2 * r] - base);
        s[t][2 * r + 1] = exp2(s[t][2 * r + 1] - base);
        sum += s[t][2 * r] + s[t][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * rescale + sum;
      rescales[r] = rescale;
      if constexpr (!kLazyRescale) {
#pragma unroll
        for (int t = 0; t < kOutTiles; ++t) {
          o[t][2 * r] *= rescale;
          o[t][2 * r + 1] *= rescale;
        }
      }
    }
    if constexpr (kLazyRescale) {
      // Rows whose max did not change have rescale 1; rows that had seen no key have o == 0.
      if (__any_sync(0xffffffffu, changed)) {
#pragma unroll
        for (int t = 0; t < kOutTiles; ++t) {
          o[t][0] *= rescales[0];
          o[t][1] *= rescales[0];
          o[t][2] *= rescales[1];
          o[t][3] *= rescales[1];
        }
      }
    }
  }

  // Ends the recurrence for row r: joins the sink logit (log2 units, -inf when there is none) to
  // the normaliser, and returns the factor that normalises the output row; *lse gets the
  // natural-log log-sum-exp, -inf for a row with no visible key and no sink (output factor 0).
  __device__ __forceinline__ float finish_row(int r, float sink_log2, float* lse) {
    const float sum = quad_sum(row_sum[r]);
    const float final_max = fmaxf(row_max[r], sink_log2);
    if (final_max == -INFINITY) {
      *lse = -INFINITY;
      return 0.0f;
    }
    const float keys_weight = exp2f(row_max[r] - final_max);  // 0 when no key was visible
    const float total = sum * keys_weight + exp2f(sink_log2 - final_max);
    if (!(total > 0.0f)) {
      *lse = -INFINITY;
      return 0.0f;
    }
    *lse = (final_max + log2f(total)) * kLn2;
    return keys_weight / total;
  }
};

}  // namespace fmha::cuda
