// What the backward adds to the forward's policies (forward_policies.cuh), as free functions over
// the same policy types, so that a feature stays one policy for both directions:
//   query_range(mask, first_key, last_key): the mask's key_range transposed, i.e. the queries that
//     can see any key of a block (the dK/dV kernel skips every other query tile);
//   visible_queries / visible_keys: visible(i, j) for one key against a tile of queries (or one
//     query against a tile of keys), computed once per row, with contains(offset): an interval of
//     tile offsets for causal / window masks (two int compares per element; visible_keys of the
//     range masks lives with them in mask_policies.cuh, where the forward uses it too), one
//     token's per-axis window for neighborhood masks (visible_keys only, for the dQ kernel at
//     bucket 256, which walks flattened rows; elsewhere both kernels tile neighborhood masks in
//     boxes, neighborhood_mask.cuh);
//   accumulate_additive_grad(p, b, h, i, j, ds): the gradient hook of the additive modifiers,
//     dS of element (i, j) into dbias / drel_h / drel_w (SPEC §4, §5);
//   score_with_grad(scores, dot, &grad): the forward's transform, plus d(score)/d(scale * dot),
//     the factor the chain rule puts between dS and the q.k product (1 without softcap,
//     1 - tanh^2 with it);
//   fold_softcap_grad (the split kernels' general policy) and softcap_tanh_tiles /
//     softcap_probs_and_grads_transposed (softcap alone in the warp-specialized fused kernel of
//     D 64 / 128) / softcap_probs_and_grads (that of D 256): that factor folded into dP - Delta.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/backward_params.h"
#include "cuda/common/forward_policies.cuh"

namespace fmha::cuda {

struct QueryRange {
  std::int64_t begin, end;  // [begin, end), clipped to [0, num_queries); empty when end <= begin
};

__device__ inline QueryRange query_range(const MaskNone&, std::int64_t, std::int64_t,
                                         std::int64_t num_queries) {
  return {0, num_queries};
}

// The queries that see a key form an interval whose bounds grow with the key (MaskWindow::seen_by):
// the union over keys [first, last] spans the first key's first query to the last key's last.
__device__ inline QueryRange query_range(const MaskWindow& m, std::int64_t first_key,
                                         std::int64_t last_key, std::int64_t num_queries) {
  const std::int64_t lo = m.seen_by(first_key).first;
  const std::int64_t hi = m.seen_by(last_key).last + 1;
  return {lo > 0 ? lo : 0, hi < num_queries ? hi : num_queries};
}

// Offsets r in [0, tile) for which query first_query + r sees key j.
__device__ inline TileBounds visible_queries(const MaskNone& m, std::int64_t j, std::int64_t,
                                             int tile) {
  return j < m.num_keys ? TileBounds{0, tile - 1} : TileBounds{0, -1};
}
__device__ inline TileBounds visible_queries(const MaskWindow& m, std::int64_t j,
                                             std::int64_t first_query, int tile) {
  if (j >= m.num_keys) return {0, -1};
  const KeySeenBy q = m.seen_by(j);
  return clamp_bounds(q.first - first_query, q.last - first_query, tile);
}

// Sets to -inf the scores of transposed tiles (rows = keys, columns = queries) that the mask
// hides or whose query is past the sequence: entries 0, 1 on key `key`, 2, 3 on key + 8; entry 0
// of tile t on query `query` + 8t. Range masks only (token tiles: hide_unseen_transposed): the
// queries that see a key are an interval, found once per key.
template <typename Mask, int kTiles>
__device__ __forceinline__ void hide_invisible_transposed(const Mask& mask, float (&s)[kTiles][4],
                                                          std::int64_t key, std::int64_t query,
                                                          std::int64_t num_queries) {
  static_assert(!Mask::kTokenTiles, "token tiles test their boxes (hide_unseen_transposed)");
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    TileBounds rows = visible_queries(mask, key + 8 * r, query, kTiles * 8);
    if (num_queries - 1 - query < rows.hi) rows.hi = static_cast<int>(num_queries - 1 - query);
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (!rows.contains(t * 8 + e)) s[t][2 * r + e] = -INFINITY;
      }
    }
  }
}

// Neighborhood masks: the visible offsets of a tile of consecutive tokens are no interval (grid
// rows, dilation groups), so the answer keeps one token's per-axis window and tests each offset's
// coordinates against it.
struct NeighborhoodTileTest {
  const NeighborhoodGrid* grid;
  neighborhood::RowWindow window;
  int first;       // token of offset 0
  int num_tokens;  // offsets reaching past the grid see nothing
  int prefix_end;  // offsets below it are visible regardless (extra keys); 0 otherwise
  __device__ bool contains(int x) const {
    if (x < prefix_end) return true;
    const int token = first + x;
    return token < num_tokens &&
           neighborhood::window_sees(*grid, window, neighborhood::coords_of(*grid, token));
  }
  __device__ static NeighborhoodTileTest prefix(int count) {
    return {nullptr, neighborhood::empty_window(), 0, 0, count};
  }
};
__device__ inline NeighborhoodTileTest visible_keys(const MaskNeighborhood& m, std::int64_t i,
                                                    std::int64_t first_key, int) {
  return {m.grid, m.row_window(i), static_cast<int>(first_key), static_cast<int>(m.num_tokens), 0};
}

__device__ __forceinline__ float score_with_grad(const ScoreScale& s, float dot, float* grad) {
  *grad = 1.0f;
  return dot * s.scale_log2;
}

template <typename T>
__device__ __forceinline__ float score_with_grad(const ScoreModifiers<T>& s, float dot,
                                                 float* grad) {
  if (s.softcap_log2 > 0.0f) {
    const float t = softcap_tanh<T>(dot * s.scale_over_softcap);  // as the forward's transform
    *grad = 1.0f - t * t;
    return s.softcap_log2 * t;
  }
  *grad = 1.0f;
  return dot * s.scale_log2;
}

__device__ __forceinline__ bool has_additive_grad(const BackwardParams& p) {
  return p.dbias_accum != nullptr || p.drel_h_accum != nullptr || p.drel_w_accum != nullptr;
}

// ds is the gradient wrt the final score of element (i, j) of head h, batch b (positions inside
// the sequence for varlen), in natural units; the caller skips elements with P = 0.
__device__ __forceinline__ void accumulate_additive_grad(const BackwardParams& p, std::int64_t b,
                                                         std::int64_t h, std::int64_t i,
                                                         std::int64_t j, float ds) {
  if (p.dbias_accum != nullptr) {
    float* const at = p.dbias_accum + b * p.dbias_accum_stride[0] + h * p.dbias_accum_stride[1] +
                      i * p.dbias_accum_stride[2] + j * p.dbias_accum_stride[3];
    if (p.dbias_atomic) {
      atomicAdd(at, ds);
    } else {
      *at = ds;
    }
  }
  if (p.drel_h_accum != nullptr || p.drel_w_accum != nullptr) {
    const std::int64_t row = (b * p.fwd.heads + h) * p.rel_rows + i;
    const std::int64_t jh = j / p.fwd.rel_w_size;
    const std::int64_t jw = j - jh * p.fwd.rel_w_size;
    if (p.drel_h_accum != nullptr) atomicAdd(p.drel_h_accum + row * p.rel_h_size + jh, ds);
    if (p.drel_w_accum != nullptr) atomicAdd(p.drel_w_accum + row * p.fwd.rel_w_size + jw, ds);
  }
}

// Softcap's chain-rule factor: with s = softcap * tanh(scale q.k / softcap) (log2 units, before
// any bias is added), ds / d(scale q.k) = 1 - tanh^2 = 1 - (s / softcap)^2. Folds it into
// dp := (dp - Delta) * (1 - tanh^2), so that P dp is the gradient wrt scale q.k; delta(t, e) is
// the Delta of entry e of tile t (per row in the dQ kernel, per column in the transposed dK/dV).
template <typename T, int kTiles, typename DeltaOf>
__device__ __forceinline__ void fold_softcap_grad(const ScoreModifiers<T>& scores,
                                                  const float (&s)[kTiles][4],
                                                  float (&dp)[kTiles][4], DeltaOf delta) {
  const float inv_softcap = 1.0f / scores.softcap_log2;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float tanh = s[t][e] * inv_softcap;
      dp[t][e] = (dp[t][e] - delta(t, e)) * (1.0f - tanh * tanh);
    }
  }
}

// Softcap alone (PolicySoftcap) in the warp-specialized fused backward's transposed tiles
// (mainloop_bwd_fused.cuh; rows = keys, entry e of tile t on query column t * 8 + fragment_col +
// (e & 1)), in two passes so that the tanh of a score needs no registers of its own while dP^T is
// computed: softcap_tanh_tiles turns the raw q.k products into tanh(scale q.k / softcap) in place
// (the forward's softcap_tanh, before the mask hides entries with -inf); after dP^T,
// softcap_probs_and_grads_transposed forms P^T = exp2(softcap tanh - lse) (log2 units, the
// forward's score) into them and dS^T = P^T (dP^T - Delta) (1 - tanh^2) into dp. The factor is
// clamped at 0 so that a hidden entry (tanh = -inf, P = 0) gets dS = 0, not 0 * -inf.
template <typename T, int kTiles>
__device__ __forceinline__ void softcap_tanh_tiles(const ScoreSoftcap<T>& scores,
                                                   float (&s)[kTiles][4]) {
  apply_softcap<T>(s, 1.0f, scores.scale_over_softcap);  // the tanh itself, not scaled
}
// One entry: s holds its tanh and becomes P = exp2(softcap tanh - lse); dp becomes
// dS = P (dP - Delta) (1 - tanh^2), the factor clamped at 0.
__device__ __forceinline__ void softcap_prob_and_grad(float& s, float& dp, float softcap_log2,
                                                      float lse, float delta) {
  const float tanh = s;
  const float factor = fmaxf(fmaf(-tanh, tanh, 1.0f), 0.0f);
  const float prob = exp2_ftz(fmaf(tanh, softcap_log2, -lse));
  dp = prob * ((dp - delta) * factor);
  s = prob;
}
template <typename T, int kTiles>
__device__ __forceinline__ void softcap_probs_and_grads_transposed(
    const ScoreSoftcap<T>& scores, float (&s)[kTiles][4], float (&dp)[kTiles][4],
    const float* lse, const float* delta, int fragment_col) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const float2 l = *reinterpret_cast<const float2*>(lse + t * 8 + fragment_col);
    const float2 d = *reinterpret_cast<const float2*>(delta + t * 8 + fragment_col);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      softcap_prob_and_grad(s[t][e], dp[t][e], scores.softcap_log2, (e & 1) ? l.y : l.x,
                            (e & 1) ? d.y : d.x);
    }
  }
}

// The same in tiles with queries on rows (the D 256 fused kernel, mainloop_bwd_fused_d256.cuh:
// entries 0, 1 of a thread on query row r0, 2, 3 on r0 + 8), whose lse and Delta are per row:
// l0, d0 of row r0 and l8, d8 of row r0 + 8. s holds softcap_tanh_tiles' tanh (-inf where the mask
// hides an entry); P = exp2(softcap tanh - lse) goes into it, dS = P (dP - Delta) (1 - tanh^2),
// the factor clamped at 0, into dp.
template <typename T, int kTiles>
__device__ __forceinline__ void softcap_probs_and_grads(const ScoreSoftcap<T>& scores,
                                                        float (&s)[kTiles][4],
                                                        float (&dp)[kTiles][4], float l0, float l8,
                                                        float d0, float d8) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      softcap_prob_and_grad(s[t][e], dp[t][e], scores.softcap_log2, e < 2 ? l0 : l8,
                            e < 2 ? d0 : d8);
    }
  }
}

// dS of a warp's m16n8 score tiles (entries 0, 1 of a thread on query `row`, 2, 3 on row + 8;
// entry 0 of tile t on key col + 8t; col even) into the dbias accumulator: plain stores where every
// element has a slot of its own, atomic adds where dbias broadcasts (pairs at once where the
// accumulator's rows keep them 8-byte aligned). Elements past the sequence are skipped.
template <int kTiles>
__device__ __forceinline__ void store_dbias_tiles(const BackwardParams& p, std::int64_t b,
                                                  std::int64_t h, std::int64_t row,
                                                  std::int64_t col, std::int64_t num_queries,
                                                  std::int64_t num_keys,
                                                  const float (&ds)[kTiles][4]) {
  const std::int64_t* const stride = p.dbias_accum_stride;
  float* const base = p.dbias_accum + b * stride[0] + h * stride[1];
  const bool pairs = stride[3] == 1 && stride[2] % 2 == 0 && stride[1] % 2 == 0 &&
                     stride[0] % 2 == 0 && reinterpret_cast<std::uintptr_t>(p.dbias_accum) % 8 == 0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t i = row + 8 * r;
    if (i >= num_queries) continue;
    float* const line = base + i * stride[2];
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const std::int64_t j = col + 8 * t;
      const float x0 = ds[t][2 * r], x1 = ds[t][2 * r + 1];
      if (j + 1 < num_keys && pairs) {
        float2* const at = reinterpret_cast<float2*>(line + j);
        if (p.dbias_atomic) {
          atomicAdd(at, make_float2(x0, x1));
        } else {
          *at = make_float2(x0, x1);
        }
        continue;
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (j + e >= num_keys) continue;
        float* const at = line + (j + e) * stride[3];
        if (p.dbias_atomic) {
          atomicAdd(at, e == 0 ? x0 : x1);
        } else {
          *at = e == 0 ? x0 : x1;
        }
      }
    }
  }
}

}  // namespace fmha::cuda
