// The sm90 forward's softmax step on a tile of scores in wgmma accumulator registers.
#pragma once

#include <cmath>

#include "cuda/common/online_softmax.cuh"

namespace fmha::cuda::sm90 {

// OnlineSoftmax::update (online_softmax.cuh) for scores still to be multiplied by `scale` (> 0;
// 1 when the policy applied it), folded into the FMA that subtracts the running max, and with
// exp2_ftz: per score one FMA and one MUFU.EX2 where exp2f(s * scale - max) took six instructions.
// With kRuns = 2 the scores of each half of the tile (n8 tiles [0, kScoreTiles / 2) and the rest)
// also get a per-row offset, offset[r][half] (the rel-pos register form's rel_h: one grid row
// each), folded the same way: into the half's maximum and its exponent base, none per score.
// The output's rescale is skipped when it multiplies every row of the warp by exactly 1 (no row
// max moved: most tiles of a long row), which changes no bit of the result.
// The scores' half of it: exponentials and row sums in place, and each row's factor for the
// output, which rescale_output applies (the overlapped forward does so only once its P V product
// of the previous tile has landed in O).
template <int kRuns, int kScoreTiles>
__device__ __forceinline__ void softmax_scores(OnlineSoftmax& sm, float (&s)[kScoreTiles][4],
                                               float (&rescale)[2], float scale,
                                               const float (&offset)[2][kRuns]) {
  static_assert(kRuns == 1 || kRuns == 2, "the whole tile, or its two halves");
  constexpr int kRunTiles = kScoreTiles / kRuns;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float run_max[kRuns];
#pragma unroll
    for (int g = 0; g < kRuns; ++g) {
      run_max[g] = -INFINITY;
#pragma unroll
      for (int t = g * kRunTiles; t < (g + 1) * kRunTiles; ++t) {
        run_max[g] = fmaxf(run_max[g], fmaxf(s[t][2 * r], s[t][2 * r + 1]));
      }
    }
    float tile_max;
    if constexpr (kRuns == 1) {
      tile_max = quad_max(run_max[0]) * scale;  // one run: no offset
    } else {
      tile_max = quad_max(
          fmaxf(fmaf(run_max[0], scale, offset[r][0]), fmaf(run_max[1], scale, offset[r][1])));
    }
    const float new_max = fmaxf(sm.row_max[r], tile_max);
    const float base = new_max == -INFINITY ? 0.0f : new_max;
    rescale[r] = exp2_ftz(sm.row_max[r] - base);
    sm.row_max[r] = new_max;
    float sum = 0.0f;
#pragma unroll
    for (int g = 0; g < kRuns; ++g) {
      const float shift = kRuns == 1 ? -base : offset[r][g] - base;
#pragma unroll
      for (int t = g * kRunTiles; t < (g + 1) * kRunTiles; ++t) {
        s[t][2 * r] = exp2_ftz(fmaf(s[t][2 * r], scale, shift));
        s[t][2 * r + 1] = exp2_ftz(fmaf(s[t][2 * r + 1], scale, shift));
        sum += s[t][2 * r] + s[t][2 * r + 1];
      }
    }
    sm.row_sum[r] = sm.row_sum[r] * rescale[r] + sum;
  }
}

// Whether any row of the warp has a factor other than 1 (a row max moved). Most tiles of a long
// row move none, and skipping the rescale then changes no bit of the result.
__device__ __forceinline__ bool output_rescaled(const float (&rescale)[2]) {
  return __any_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f);
}

// O's rows times their factors.
template <int kOutTiles>
__device__ __forceinline__ void scale_output(float (&o)[kOutTiles][4], const float (&rescale)[2]) {
#pragma unroll
  for (int t = 0; t < kOutTiles; ++t) {
    o[t][0] *= rescale[0];
    o[t][1] *= rescale[0];
    o[t][2] *= rescale[1];
    o[t][3] *= rescale[1];
  }
}

// O's rows times their factors, skipped when every row of the warp keeps factor 1.
template <int kOutTiles>
__device__ __forceinline__ void rescale_output(float (&o)[kOutTiles][4], const float (&rescale)[2]) {
  if (output_rescaled(rescale)) scale_output(o, rescale);
}

template <int kRuns, int kScoreTiles, int kOutTiles>
__device__ __forceinline__ void softmax_update(OnlineSoftmax& sm, float (&s)[kScoreTiles][4],
                                               float (&o)[kOutTiles][4], float scale,
                                               const float (&offset)[2][kRuns]) {
  float rescale[2];
  softmax_scores(sm, s, rescale, scale, offset);
  rescale_output(o, rescale);
}

}  // namespace fmha::cuda::sm90
