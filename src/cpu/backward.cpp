// Backward of the fast CPU backend. Every gradient element is summed by one task in a fixed order,
// so results are bitwise the same for any thread count. Two structures:
//   split: two passes,
//     dK/dV: one task per (sequence, kv head, key tile): the query tiles of every query head of
//            the group that see the tile, in order, recomputing P from the forward's lse;
//     dQ:    one task per (sequence, query head, query tile): the key tiles it sees, in order;
//   extra keys (SPEC §7): the dQ task's key tiles end with the sequence's extra keys; their
//          dK/dV (dextra_k / dextra_v) take one task per (sequence, kv head, extra key tile) over
//          every query tile of the group, or the fused task's last key tiles;
//   fused: one task per (sequence, kv head) runs the dK/dV loop over all its key tiles and adds
//          dS K into a private fp32 dQ of the group's rows: 5 products per tile pair instead of 7,
//          but only sequences x kv heads tasks, and a dQ buffer of group x Lq x D floats.
// A neighborhood call's tiles are boxes of its grid and the tiles they see, gathered (tiles.h,
// neighborhood.h); its fused dQ adds each gathered query's row of a tile to the query's own row.
// The structure depends on the problem and backward_impl only (backward()), never on threads.
// Delta = dout . out - dlse (SPEC §11) is computed once per row before both, except where every key
// of the sequence sits in the tile: there the tile's own sum_j P dP - dlse is at hand before dS is
// needed, and it does not go through the stored out, whose fp16 / bf16 rounding dominates
// dP - Delta when a row's probability sits on one key (a key and a sink, say); there P is also
// divided by the row's own sum, so that the stored lse's error cancels (score_gradients). dsinks
// comes last, from Delta = sum_j P dP - dlse, a sum the dQ pass takes of its rows for free (it has
// P and dP at hand) and which does not go through the stored out: dsinks is a plain sum over rows
// of P_sink Delta, where the rounding of an fp16 / bf16 out does not average away as it does in
// the other gradients.
// Q is loaded pre-multiplied by the scale: S = Qs K^T, dK = dS'^T Qs and dQ = scale dS' K, where
// dS' = dS times the softcap slope.
#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "cpu/backend.h"
#include "cpu/bf16_dot.h"
#include "cpu/kernels.h"
#include "cpu/neighborhood.h"
#include "cpu/parallel.h"
#include "cpu/tiles.h"

namespace fmha::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::size_t at(std::int64_t i) {
  return static_cast<std::size_t>(i);
}

// Per query row and head, indexed (sequence.row + i) * H + h: the lse the probabilities are
// recomputed from (+inf for a row that saw nothing, so that exp(s - lse) = 0) and Delta.
struct RowStats {
  std::vector<float> lse, delta, dlse;
  std::vector<float> p_dp;  // sum over keys of P dP, written by the dQ pass when dsinks is asked
};

// One worker's tiles (see the file comment for the roles of each), kept between calls by its
// thread and allocated again when the head dims change, as the forward's (forward.cpp); a fused
// task's buffers that grow with the sequence are released after the task when large.
struct BackwardScratch {
  std::int64_t head_dim = -1, value_dim = -1;  // the dims the tiles are laid out for
  std::vector<float> q;      // [kQueryTile, D rounded up to 16], scaled; padding columns 0
  std::vector<float> dout;   // [kQueryTile, Dv rounded up], padding columns 0
  std::vector<float> kt;     // [D, kKeyTile]
  std::vector<float> vt;     // [Dv, kKeyTile]
  std::vector<float> k;      // [kKeyTile, D rounded up]: dQ's right operand
  std::vector<float> p;      // [kQueryTile, kKeyTile]: S, then P
  std::vector<float> ds;     // [kQueryTile, kKeyTile]: dP, then dS'
  std::vector<float> slope;  // [kQueryTile, kKeyTile]: softcap's 1 - tanh^2
  std::vector<float> acc_a;  // dQ [kQueryTile, D up] or dK [kKeyTile, D up]
  std::vector<float> acc_b;  // dV [kKeyTile, Dv up]
  std::vector<float> dq_part;  // fused, gathered query tiles: a tile's dQ [kQueryTile, D up]
  std::vector<float> lse, delta, dlse, p_dp;  // [kQueryTile]
  std::vector<float> dq_all,
      p_dp_all;  // fused: dQ [group, Lq up to kQueryTile, D up], sums of P dP
  // drel: each owned row's sums, Hk of rel_h's then Wk of rel_w's: the dQ pass's tile, or the
  // fused task's [group, Lq up to kQueryTile] rows.
  std::vector<float> rel, rel_all;
  // A summed dbias: the task's rows (or one) x Lk (or one). In double: summed over keys, it adds
  // dS of both signs (a row's sum to its dlse), and fp32 partial sums of a few hundred of them
  // left an fp32 draw's dbias 1.2e-5 from float64 against SPEC's 1e-5.
  std::vector<double> dbias_sum;
  // S = Q K^T and dP = dO V^T on bf16 dot products (bf16_dot.h), set per call: Q and dO as bf16
  // pairs [kQueryTile, pairs(D) / pairs(Dv)], unscaled, besides q and dout (the other products'
  // operands); K and V transposed as pairs [pairs(D) / pairs(Dv), kKeyTile] in place of kt, vt.
  bool bf16_dot = false;
  std::vector<std::uint32_t> q_pairs, dout_pairs, kt_pairs, vt_pairs;
  NeighborhoodScratch na;        // a neighborhood task's gathered tiles

  void allocate(const Call& c) {
    if (head_dim == c.head_dim && value_dim == c.value_dim) return;
    head_dim = c.head_dim;
    value_dim = c.value_dim;
    const std::int64_t dp = round_up(c.head_dim, kLanes), dvp = round_up(c.value_dim, kLanes);
    const std::int64_t tile = std::max(kQueryTile, kKeyTile);
    const std::int64_t pq = pair_count(c.head_dim), pv = pair_count(c.value_dim);
    q_pairs.assign(at(kQueryTile * pq), 0u);
    dout_pairs.assign(at(kQueryTile * pv), 0u);
    kt_pairs.assign(at(pq * kKeyTile), 0u);
    vt_pairs.assign(at(pv * kKeyTile), 0u);
    q.assign(at(kQueryTile * dp), 0.0f);
    dout.assign(at(kQueryTile * dvp), 0.0f);
    kt.assign(at(c.head_dim * kKeyTile), 0.0f);
    vt.assign(at(c.value_dim * kKeyTile), 0.0f);
    k.assign(at(kKeyTile * dp), 0.0f);
    p.assign(at(kQueryTile * kKeyTile), 0.0f);
    ds.assign(at(kQueryTile * kKeyTile), 0.0f);
    slope.assign(at(kQueryTile * kKeyTile), 1.0f);
    acc_a.assign(at(tile * dp), 0.0f);
    acc_b.assign(at(kKeyTile * dvp), 0.0f);
    dq_part.assign(at(kQueryTile * dp), 0.0f);
    lse.assign(at(kQueryTile), 0.0f);
    delta.assign(at(kQueryTile), 0.0f);
    dlse.assign(at(kQueryTile), 0.0f);
    p_dp.assign(at(kQueryTile), 0.0f);
  }
};

// Loads the queries of `queries` of head h: Qs and dO rows (rows .. rows_pad - 1 zeroed), their
// lse and Delta (padding rows: lse +inf, so their probabilities are 0).
FMHA_CPU_INLINE void load_query_tile(const Call& c, const RowStats& stats, const Sequence& seq,
                                     std::int64_t h, const Tile& queries, std::int64_t rows_pad,
                                     BackwardScratch& w) {
  const std::int64_t dp = round_up(c.head_dim, kLanes), dvp = round_up(c.value_dim, kLanes);
  const std::int64_t pq = pair_count(c.head_dim), pv = pair_count(c.value_dim);
  const std::int64_t rows = queries.count;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t token = seq.first_q + queries.token(r);
    load_features(c.q, c.q.offset(seq.batch, token, h), c.head_dim, c.scale, &w.q[at(r * dp)], 1);
    load_features(c.dout, c.dout.offset(seq.batch, token, h), c.value_dim, 1.0f,
                  &w.dout[at(r * dvp)], 1);
    if (w.bf16_dot) {
      load_bf16_pairs(c.q, c.q.offset(seq.batch, token, h), c.head_dim, &w.q_pairs[at(r * pq)], 1);
      load_bf16_pairs(c.dout, c.dout.offset(seq.batch, token, h), c.value_dim,
                      &w.dout_pairs[at(r * pv)], 1);
    }
    const std::size_t row = at((seq.row + queries.token(r)) * c.heads + h);
    w.lse[at(r)] = stats.lse[row];
    w.delta[at(r)] = stats.delta[row];
    w.dlse[at(r)] = stats.dlse[row];
  }
  for (std::int64_t r = rows; r < rows_pad; ++r) {
    std::fill_n(&w.q[at(r * dp)], dp, 0.0f);
    std::fill_n(&w.dout[at(r * dvp)], dvp, 0.0f);
    if (w.bf16_dot) {
      std::fill_n(&w.q_pairs[at(r * pq)], pq, 0u);
      std::fill_n(&w.dout_pairs[at(r * pv)], pv, 0u);
    }
    w.lse[at(r)] = kInf;
    w.delta[at(r)] = 0.0f;
    w.dlse[at(r)] = 0.0f;
  }
}

// Loads the keys of `keys` (from `from`) of kv head kvh: K^T and V^T (columns keys.count ..
// ncols - 1 zeroed) and, with_rows, K row-major.
FMHA_CPU_INLINE void load_key_tile(const Call& c, const KeyRows& from, std::int64_t kvh,
                                   const Tile& keys, std::int64_t ncols, BackwardScratch& w,
                                   bool with_rows) {
  const std::int64_t dp = round_up(c.head_dim, kLanes), cols = keys.count;
  for (std::int64_t j = 0; j < cols; ++j) {
    const std::int64_t token = from.first + keys.token(j);
    const std::int64_t k_offset = from.k->offset(from.batch, token, kvh);
    const std::int64_t v_offset = from.v->offset(from.batch, token, kvh);
    if (w.bf16_dot) {
      load_bf16_pairs(*from.k, k_offset, c.head_dim, &w.kt_pairs[at(j)], kKeyTile);
      load_bf16_pairs(*from.v, v_offset, c.value_dim, &w.vt_pairs[at(j)], kKeyTile);
    } else {
      load_features(*from.k, k_offset, c.head_dim, 1.0f, &w.kt[at(j)], kKeyTile);
      load_features(*from.v, v_offset, c.value_dim, 1.0f, &w.vt[at(j)], kKeyTile);
    }
    if (with_rows) load_features(*from.k, k_offset, c.head_dim, 1.0f, &w.k[at(j * dp)], 1);
  }
  if (w.bf16_dot) {
    for (std::int64_t p = 0; p < pair_count(c.head_dim); ++p)
      std::fill_n(&w.kt_pairs[at(p * kKeyTile + cols)], ncols - cols, 0u);
    for (std::int64_t p = 0; p < pair_count(c.value_dim); ++p)
      std::fill_n(&w.vt_pairs[at(p * kKeyTile + cols)], ncols - cols, 0u);
    return;
  }
  for (std::int64_t d = 0; d < c.head_dim; ++d)
    std::fill_n(&w.kt[at(d * kKeyTile + cols)], ncols - cols, 0.0f);
  for (std::int64_t d = 0; d < c.value_dim; ++d)
    std::fill_n(&w.vt[at(d * kKeyTile + cols)], ncols - cols, 0.0f);
}

// Adds dS of keys k0 .. k0 + cols - 1 (ds[0 .. cols)) to one row's rel-pos sums: sums[kh] over the
// keys of grid row kh (rel_h's gradient), sums[Hk + kw] over those of grid column kw (rel_w's).
FMHA_CPU_INLINE void add_rel_sums(const Call& c, std::int64_t k0, std::int64_t cols,
                                  const float* ds, float* sums) {
  const std::int64_t wk = c.rel_w_size;
  float* col_sums = sums + c.rel_h_size;
  std::int64_t kh = k0 / wk, kw = k0 % wk, j = 0;
  while (j < cols) {
    const std::int64_t run = std::min(wk - kw, cols - j);
    float row_sum = 0.0f;
    for (std::int64_t x = 0; x < run; ++x) {
      row_sum += ds[j + x];
      col_sums[kw + x] += ds[j + x];
    }
    sums[kh] += row_sum;
    j += run, ++kh, kw = 0;
  }
}

// rel_h / rel_w's gradients of row i (batch b, head h) from its sums, in their dtypes.
FMHA_CPU_INLINE void store_rel_sums(const Call& c, std::int64_t b, std::int64_t h, std::int64_t i,
                                    const float* sums) {
  if (c.drel_h.given()) store_strided(c.drel_h, c.drel_h.row(b, h, i), c.rel_h_size, sums);
  if (c.drel_w.given()) {
    store_strided(c.drel_w, c.drel_w.row(b, h, i), c.rel_w_size, sums + c.rel_h_size);
  }
}

// Zeroes dbias[b, h, i, 0 .. keys) (through w.p's first row, which the tile's scores overwrite).
FMHA_CPU_INLINE void zero_dbias_row(const Call& c, std::int64_t b, std::int64_t h, std::int64_t i,
                                    std::int64_t keys, BackwardScratch& w) {
  float* zeros = w.p.data();
  std::fill_n(zeros, kKeyTile, 0.0f);
  for (std::int64_t k0 = 0; k0 < keys; k0 += kKeyTile) {
    store_strided(c.dbias, c.dbias.row(b, h, i) + k0 * c.dbias.stride[3],
                  std::min(kKeyTile, keys - k0), zeros);
  }
}

// S = Qs K^T into w.p and dP = dO V^T into w.ds for the loaded tiles (rows_pad rows, ncols
// columns): on bf16 pairs where w.bf16_dot says so (S scaled after the sums), else on fp32 tiles.
template <typename Traits>
FMHA_CPU_INLINE void score_products(const Call& c, std::int64_t rows_pad, std::int64_t ncols,
                                    BackwardScratch& w) {
#if FMHA_CPU_X86
  if (w.bf16_dot) {
    using V = typename Traits::V;
    const std::int64_t pq = pair_count(c.head_dim), pv = pair_count(c.value_dim);
    gemm_bf16_pairs(rows_pad, ncols, pq, w.q_pairs.data(), pq, w.kt_pairs.data(), kKeyTile,
                    w.p.data(), kKeyTile);
    gemm_bf16_pairs(rows_pad, ncols, pv, w.dout_pairs.data(), pv, w.vt_pairs.data(), kKeyTile,
                    w.ds.data(), kKeyTile);
    const typename V::F scale = V::broadcast(c.scale);
    for (std::int64_t r = 0; r < rows_pad; ++r) {
      float* row = &w.p[at(r * kKeyTile)];
      for (std::int64_t j = 0; j < ncols; j += V::kWidth)
        V::store(row + j, V::load(row + j) * scale);
    }
    return;
  }
#endif
  const std::int64_t dp = round_up(c.head_dim, kLanes), dvp = round_up(c.value_dim, kLanes);
  gemm<Traits>(rows_pad, ncols, c.head_dim, w.q.data(), dp, 1, w.kt.data(), kKeyTile, w.p.data(),
               kKeyTile, false);
  gemm<Traits>(rows_pad, ncols, c.value_dim, w.dout.data(), dvp, 1, w.vt.data(), kKeyTile,
               w.ds.data(), kKeyTile, false);
}

// For tile pair t of `tiles` (its query tile loaded, rows_pad rows of batch index b, head h, and
// its key tile, ncols columns): w.p = P and w.ds = dS' = P (dP - Delta) x softcap slope; the
// scores recomputed with the bias and rel-pos too. Masked and padding entries get P = 0, hence
// dS' = 0. With row_sums, w.p_dp[r] also gains the row's sum of P dP. dbias and drel are written
// by band tiles only (backend.cpp keeps them off neighborhood calls; extra keys have neither).
template <typename Traits, typename Tiles>
FMHA_CPU_INLINE void score_gradients(const Call& c, const Tiles& tiles, std::int64_t t,
                                     std::int64_t b, std::int64_t h, std::int64_t rows_pad,
                                     std::int64_t ncols, BackwardScratch& w, bool row_sums,
                                     bool exact_delta, bool owns_rows, float* rel_rows = nullptr,
                                     double* dbias_sum = nullptr,
                                     std::int64_t dbias_sum_width = 0) {
  using V = typename Traits::V;
  const Tile queries = tiles.queries(t), keys = tiles.keys(t);
  const std::int64_t rows = queries.count, cols = keys.count, k0 = keys.first;
  float* p = w.p.data();
  float* ds = w.ds.data();
  score_products<Traits>(c, rows_pad, ncols, w);
  const bool full = tiles.full(t);
  const bool softcap = c.softcap > 0.0f;
  for (std::int64_t r = 0; r < rows_pad; ++r) {
    float* prow = p + r * kKeyTile;
    float* dsrow = ds + r * kKeyTile;
    float* slope = &w.slope[at(r * kKeyTile)];
    if (r < rows) {
      if (softcap) {
        const float inverse = 1.0f / c.softcap;
        for (std::int64_t j = 0; j < ncols; j += V::kWidth) {
          const typename V::F t = V::tanh(V::load(prow + j) * inverse);
          V::store(prow + j, t * c.softcap);
          V::store(slope + j, 1.0f - t * t);
        }
      }
      tiles.add_terms(c, b, h, t, r, prow);
      if (!full) tiles.hide(t, r, prow);
    }
    for (std::int64_t j = cols; j < ncols; ++j) prow[j] = kNegInf;
    const float lse = w.lse[at(r)];
    typename V::F p_dp{}, p_sum{};
    for (std::int64_t j = 0; j < ncols; j += V::kWidth) {
      const typename V::F prob = V::exp(V::load(prow + j) - lse);
      V::store(prow + j, prob);
      p_dp += prob * V::load(dsrow + j);
      p_sum += prob;
    }
    if (exact_delta && lse != kInf) {
      // exp(S - lse) sums to 1 only up to lse's error, which is absolute and so a factor 1 + e
      // common to the row (an fp32 lse near 8: its rounding alone up to 5e-7; the forward's sum
      // adds more). Delta taken from these P leaves sum_j dS = e Delta instead of 0, which dQ and
      // dK of a row whose probability sits on one key (dP - Delta small against Delta) magnify: an
      // fp32 varlen draw's dQ 1.04e-5 against SPEC's 1e-5, 4.7e-6 after. The tile holds every key:
      // divided by their sum and the sink's weight, P is the softmax of these very scores.
      const float sink =
          c.sinks.given() ? std::exp(load_stat(c.sinks, h * c.sinks.head_stride) - lse) : 0.0f;
      const typename V::F sum = V::broadcast(V::reduce_sum(p_sum) + sink);
      p_dp = typename V::F{};
      for (std::int64_t j = 0; j < ncols; j += V::kWidth) {
        const typename V::F prob = V::load(prow + j) / sum;
        V::store(prow + j, prob);
        p_dp += prob * V::load(dsrow + j);
      }
    }
    const float row_p_dp = V::reduce_sum(p_dp);
    const float delta = exact_delta ? row_p_dp - w.dlse[at(r)] : w.delta[at(r)];
    // dS = P (dP - Delta) is the bias's gradient (SPEC §4), and summed over grid columns / rows
    // rel-pos's (SPEC §5), before softcap's slope: an owned row that writes them takes the slope
    // after.
    const bool dbias = !Tiles::kExtraKeys && owns_rows && c.dbias.given() && r < rows;
    const bool drel = !Tiles::kExtraKeys && rel_rows != nullptr && r < rows;
    for (std::int64_t j = 0; j < ncols; j += V::kWidth) {
      typename V::F grad = V::load(prow + j) * (V::load(dsrow + j) - delta);
      if (softcap && !dbias && !drel) grad *= V::load(slope + j);
      V::store(dsrow + j, grad);
    }
    if (dbias && dbias_sum != nullptr) {  // a sum over broadcast dimensions, in the task's order
      // Summed rows share one row of the sum, summed keys one column.
      const std::int64_t col_stride = c.dbias_sums[3] ? 0 : 1;
      const std::int64_t row_stride = c.dbias_sums[2] ? 0 : dbias_sum_width;
      double* sum = dbias_sum + r * row_stride + k0 * col_stride;
      for (std::int64_t j = 0; j < cols; ++j) sum[j * col_stride] += dsrow[j];
    } else if (dbias) {
      store_strided(c.dbias, c.dbias.row(b, h, queries.token(r)) + k0 * c.dbias.stride[3], cols,
                    dsrow);
    }
    if (drel) add_rel_sums(c, k0, cols, dsrow, rel_rows + r * (c.rel_h_size + c.rel_w_size));
    if (softcap && (dbias || drel)) {
      for (std::int64_t j = 0; j < ncols; j += V::kWidth)
        V::store(dsrow + j, V::load(dsrow + j) * V::load(slope + j));
    }
    if (row_sums) w.p_dp[at(r)] += row_p_dp;
  }
}

// Whether the tile of `cols` keys (of the sequence, or its extra keys with Tiles::kExtraKeys)
// holds every key a query of the sequence sees: the tile's own sum of P dP is then Delta
// (score_gradients' exact_delta). A sequence without keys of its own sees its extra keys alone.
template <typename Tiles>
FMHA_CPU_INLINE bool holds_every_key(const Call& c, const Sequence& seq, std::int64_t cols) {
  if constexpr (Tiles::kExtraKeys) return seq.len_k == 0 && cols == c.num_extra;
  return c.num_extra == 0 && cols == seq.len_k;
}

// The loaded query tile (rows_pad rows of head h) against the key tiles of `tiles`: dQ added to
// `dq`, dbias, drel and the sums of P dP as dq_rows says.
template <typename Traits, typename Tiles>
FMHA_CPU_INLINE void dq_key_tiles(const Call& c, const Sequence& seq, std::int64_t h,
                                  const Tiles& tiles, std::int64_t rows_pad, BackwardScratch& w,
                                  bool row_sums, float* rel_rows, double* dbias_sum, float* dq) {
  const std::int64_t dp = round_up(c.head_dim, kLanes);
  const KeyRows from = key_rows<Tiles>(c, seq);
  for (std::int64_t t = 0; t < tiles.count(); ++t) {
    const Tile keys = tiles.keys(t);
    const std::int64_t ncols = round_up(keys.count, kLanes);
    load_key_tile(c, from, h / c.group(), keys, ncols, w, true);
    score_gradients<Traits>(c, tiles, t, seq.index, h, rows_pad, ncols, w, row_sums,
                            holds_every_key<Tiles>(c, seq, keys.count), /*owns_rows=*/true,
                            rel_rows, dbias_sum, c.dbias_sums[3] ? 1 : seq.len_k);
    gemm<Traits>(rows_pad, dp, keys.count, w.ds.data(), kKeyTile, 1, w.k.data(), dp, dq, dp,
                 true);
  }
}

// dQ of the queries of `tiles` (head h of one sequence) against its key tiles and the extra keys;
// dbias_sum: the rows' dS added to it (a sum over the batch) instead of stored.
template <typename Traits, typename Tiles>
FMHA_CPU_INLINE void dq_rows(const Call& c, RowStats& stats, const Sequence& seq, std::int64_t h,
                             const Tiles& tiles, BackwardScratch& w, double* dbias_sum) {
  const std::int64_t dp = round_up(c.head_dim, kLanes);
  const Tile queries = tiles.queries(0);
  const std::int64_t rows = queries.count;
  const std::int64_t rows_pad = round_up(rows, Traits::kRows);
  float* dq = w.acc_a.data();
  load_query_tile(c, stats, seq, h, queries, rows_pad, w);
  std::fill_n(dq, rows_pad * dp, 0.0f);
  // The task owns these rows of dbias: zero first, for the key tiles no row of it sees.
  for (std::int64_t r = 0; r < rows && c.dbias.given() && dbias_sum == nullptr; ++r) {
    zero_dbias_row(c, seq.index, h, queries.token(r), seq.len_k, w);
  }
  const std::int64_t rel_width = c.rel_h_size + c.rel_w_size;
  float* rel_rows = nullptr;
  if (c.wants_drel()) {
    w.rel.assign(at(rows * rel_width), 0.0f);
    rel_rows = w.rel.data();
  }
  std::fill_n(w.p_dp.data(), rows_pad, 0.0f);
  const bool row_sums = !stats.p_dp.empty();
  dq_key_tiles<Traits>(c, seq, h, tiles, rows_pad, w, row_sums, rel_rows, dbias_sum, dq);
  if (c.num_extra > 0) {
    dq_key_tiles<Traits>(c, seq, h, ExtraTiles::for_queries(c, queries), rows_pad, w, row_sums,
                         rel_rows, dbias_sum, dq);
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = queries.token(r);
    store_features(c.dq, c.dq.offset(seq.batch, seq.first_q + i, h), c.head_dim, dq + r * dp,
                   c.scale);
    // The task owns these rows: no other task writes their entries.
    if (row_sums) stats.p_dp[at((seq.row + i) * c.heads + h)] = w.p_dp[at(r)];
    if (rel_rows != nullptr) store_rel_sums(c, seq.index, h, i, rel_rows + r * rel_width);
  }
}

// The dQ pass's task: one sequence's query tile from q0 (a neighborhood call's: query box
// `start`); with a summed dbias, that tile of every sequence it sums over (a dense call's are
// alike), of every head, and every query tile (from q0 = 0), their dS summed in sequence, head,
// tile and row order, then stored.
template <typename Traits>
FMHA_CPU_INLINE void dq_tile(const Call& c, RowStats& stats, const Sequence& seq, std::int64_t h,
                             std::int64_t start, BackwardScratch& w) {
  if (c.neighborhood != nullptr) {
    dq_rows<Traits>(c, stats, seq, h,
                    NeighborhoodTiles::for_queries(*c.neighborhood, start, w.na), w, nullptr);
    return;
  }
  const std::int64_t q0 = start, rows = std::min(kQueryTile, seq.len_q - q0);
  if (!c.dbias_summed()) {
    dq_rows<Traits>(c, stats, seq, h, BandTiles::for_queries(c, seq, q0, rows), w, nullptr);
    return;
  }
  const bool* sums = c.dbias_sums;
  const std::int64_t height = sums[2] ? 1 : rows, width = sums[3] ? 1 : seq.len_k;
  w.dbias_sum.assign(at(height * width), 0.0);
  const std::size_t first_seq = sums[0] ? 0 : at(seq.index);
  const std::size_t end_seq = sums[0] ? c.sequences.size() : first_seq + 1;
  for (std::size_t b = first_seq; b < end_seq; ++b) {
    const Sequence& each = c.sequences[b];
    for (std::int64_t g = sums[1] ? 0 : h; g < (sums[1] ? c.heads : h + 1); ++g) {
      for (std::int64_t q = q0; q < (sums[2] ? each.len_q : q0 + 1); q += kQueryTile) {
        const std::int64_t tile_rows = std::min(kQueryTile, each.len_q - q);
        dq_rows<Traits>(c, stats, each, g, BandTiles::for_queries(c, each, q, tile_rows), w,
                        w.dbias_sum.data());
      }
    }
  }
  // The summed dimensions have stride 0 (ScoreTerm): these rows are every one of them, stored
  // through w.p's first row in runs of a key tile. Without keys (Lk 0) the buffer is empty: a
  // pointer into it, never a reference to an element.
  float* run = w.p.data();
  for (std::int64_t r = 0; r < height; ++r) {
    const double* sum = w.dbias_sum.data() + r * width;
    for (std::int64_t k0 = 0; k0 < width; k0 += kKeyTile) {
      const std::int64_t n = std::min(kKeyTile, width - k0);
      for (std::int64_t j = 0; j < n; ++j) run[j] = static_cast<float>(sum[k0 + j]);
      store_strided(c.dbias, c.dbias.row(seq.index, h, q0 + r) + k0 * c.dbias.stride[3], n, run);
    }
  }
}

// dK and dV of the keys of `tiles` against its query tiles; fused, also dQ (and the sums of P dP)
// of every query tile it meets, into w.dq_all (and w.p_dp_all), each query at its token's row.
template <typename Traits, typename Tiles>
FMHA_CPU_INLINE void dkdv_rows(const Call& c, RowStats& stats, const Sequence& seq,
                               std::int64_t kvh, const Tiles& tiles, BackwardScratch& w,
                               bool fused) {
  const std::int64_t dp = round_up(c.head_dim, kLanes), dvp = round_up(c.value_dim, kLanes);
  const Tile keys = tiles.keys(0);
  const std::int64_t cols = keys.count;
  const std::int64_t ncols = round_up(cols, kLanes);  // a multiple of every kRows
  float* dk = w.acc_a.data();
  float* dv = w.acc_b.data();
  const KeyRows from = key_rows<Tiles>(c, seq);
  load_key_tile(c, from, kvh, keys, ncols, w, fused);
  std::fill_n(dk, ncols * dp, 0.0f);
  std::fill_n(dv, ncols * dvp, 0.0f);
  for (std::int64_t g = 0; g < c.group(); ++g) {
    const std::int64_t h = kvh * c.group() + g;
    for (std::int64_t t = 0; t < tiles.count(); ++t) {
      const Tile queries = tiles.queries(t);
      const std::int64_t rows = queries.count, q0 = queries.first;
      const std::int64_t rows_pad = round_up(rows, Traits::kRows);
      load_query_tile(c, stats, seq, h, queries, rows_pad, w);
      const bool row_sums = fused && !stats.p_dp.empty();
      if (row_sums) std::fill_n(w.p_dp.data(), rows_pad, 0.0f);
      const std::int64_t rel_width = c.rel_h_size + c.rel_w_size;
      float* rel_rows = fused && c.wants_drel()
                            ? &w.rel_all[at((g * round_up(seq.len_q, kQueryTile) + q0) * rel_width)]
                            : nullptr;
      score_gradients<Traits>(c, tiles, t, seq.index, h, rows_pad, ncols, w, row_sums,
                              holds_every_key<Tiles>(c, seq, cols),
                              /*owns_rows=*/fused, rel_rows);
      // dV += P^T dO and dK += dS'^T Qs: A is read transposed through its strides.
      gemm<Traits>(ncols, dvp, rows, w.p.data(), 1, kKeyTile, w.dout.data(), dvp, dv, dvp, true);
      gemm<Traits>(ncols, dp, rows, w.ds.data(), 1, kKeyTile, w.q.data(), dp, dk, dp, true);
      const std::int64_t head_rows = g * round_up(seq.len_q, kQueryTile);
      if (fused && queries.gathered == nullptr) {
        // dQ rows of head g from q0; rows past Lq are padding, their dS' is 0.
        const std::int64_t first_row = head_rows + q0;
        gemm<Traits>(rows_pad, dp, cols, w.ds.data(), kKeyTile, 1, w.k.data(), dp,
                     &w.dq_all[at(first_row * dp)], dp, true);
        for (std::int64_t r = 0; r < rows && row_sums; ++r)
          w.p_dp_all[at(first_row + r)] += w.p_dp[at(r)];
      } else if (fused) {  // gathered queries: the tile's dQ, then added to each query's row
        gemm<Traits>(rows_pad, dp, cols, w.ds.data(), kKeyTile, 1, w.k.data(), dp,
                     w.dq_part.data(), dp, false);
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t row = head_rows + queries.token(r);
          float* dq_row = &w.dq_all[at(row * dp)];
          const float* part = &w.dq_part[at(r * dp)];
          for (std::int64_t d = 0; d < dp; ++d) dq_row[d] += part[d];
          if (row_sums) w.p_dp_all[at(row)] += w.p_dp[at(r)];
        }
      }
    }
  }
  for (std::int64_t j = 0; j < cols; ++j) {
    const std::int64_t token = from.first + keys.token(j);
    if (from.dk->given()) {
      store_features(*from.dk, from.dk->offset(from.batch, token, kvh), c.head_dim, dk + j * dp,
                     1.0f);
    }
    if (from.dv->given()) {
      store_features(*from.dv, from.dv->offset(from.batch, token, kvh), c.value_dim,
                     dv + j * dvp, 1.0f);
    }
  }
}

// The dK / dV pass's task: keys k0 .. k0 + kKeyTile - 1 of kv head kvh (a neighborhood call's: key
// box `start`).
template <typename Traits>
FMHA_CPU_INLINE void dkdv_tile(const Call& c, RowStats& stats, const Sequence& seq,
                               std::int64_t kvh, std::int64_t start, BackwardScratch& w,
                               bool fused = false) {
  if (c.neighborhood != nullptr) {
    dkdv_rows<Traits>(c, stats, seq, kvh,
                      NeighborhoodTiles::for_keys(*c.neighborhood, start, kQueryTile, w.na), w,
                      fused);
    return;
  }
  const std::int64_t cols = std::min(kKeyTile, seq.len_k - start);
  dkdv_rows<Traits>(c, stats, seq, kvh, BandTiles::for_keys(c, seq, start, cols, kQueryTile), w,
                    fused);
}

// The dK / dV pass's task over extra keys (SPEC §7): extra keys r0 .. r0 + kKeyTile - 1 of kv head
// kvh against every query tile of the sequence, into dextra_k / dextra_v (when given).
template <typename Traits>
FMHA_CPU_INLINE void dextra_tile(const Call& c, RowStats& stats, const Sequence& seq,
                                 std::int64_t kvh, std::int64_t r0, BackwardScratch& w,
                                 bool fused = false) {
  const std::int64_t cols = std::min(kKeyTile, c.num_extra - r0);
  dkdv_rows<Traits>(c, stats, seq, kvh, ExtraTiles::for_keys(seq, r0, cols, kQueryTile), w,
                    fused);
}

// The fused structure's task: every key tile of kv head kvh and its extra keys, then the group's dQ
// rows.
template <typename Traits>
FMHA_CPU_INLINE void fused_task(const Call& c, RowStats& stats, const Sequence& seq,
                                std::int64_t kvh, BackwardScratch& w) {
  const std::int64_t dp = round_up(c.head_dim, kLanes);
  const std::int64_t rows_per_head = round_up(seq.len_q, kQueryTile);
  const bool row_sums = !stats.p_dp.empty();
  w.dq_all.assign(at(c.group() * rows_per_head * dp), 0.0f);
  if (row_sums) w.p_dp_all.assign(at(c.group() * rows_per_head), 0.0f);
  // The task owns its group's rows of dbias: zero first, for the tiles no key tile's band reaches.
  for (std::int64_t g = 0; g < c.group() && c.dbias.given(); ++g) {
    for (std::int64_t i = 0; i < seq.len_q; ++i)
      zero_dbias_row(c, seq.index, kvh * c.group() + g, i, seq.len_k, w);
  }
  const std::int64_t rel_width = c.rel_h_size + c.rel_w_size;
  if (c.wants_drel()) w.rel_all.assign(at(c.group() * rows_per_head * rel_width), 0.0f);
  // Key tiles from k0, or a neighborhood call's key boxes.
  const NeighborhoodGeometry* na = c.neighborhood;
  const std::int64_t end = na != nullptr ? na->boxes(na->key_box) : seq.len_k;
  for (std::int64_t start = 0; start < end; start += na != nullptr ? 1 : kKeyTile)
    dkdv_tile<Traits>(c, stats, seq, kvh, start, w, true);
  for (std::int64_t r0 = 0; r0 < c.num_extra; r0 += kKeyTile)
    dextra_tile<Traits>(c, stats, seq, kvh, r0, w, true);
  for (std::int64_t g = 0; g < c.group(); ++g) {
    const std::int64_t h = kvh * c.group() + g;
    for (std::int64_t i = 0; i < seq.len_q; ++i) {
      const std::int64_t row = g * rows_per_head + i;
      store_features(c.dq, c.dq.offset(seq.batch, seq.first_q + i, h), c.head_dim,
                     &w.dq_all[at(row * dp)], c.scale);
      if (row_sums) stats.p_dp[at((seq.row + i) * c.heads + h)] = w.p_dp_all[at(row)];
      if (c.wants_drel()) store_rel_sums(c, seq.index, h, i, &w.rel_all[at(row * rel_width)]);
    }
  }
  // The thread keeps its scratch between calls: a long sequence's buffers are not kept.
  constexpr std::size_t kKeptFloats = std::size_t{1} << 20;
  for (std::vector<float>* buffer : {&w.dq_all, &w.p_dp_all, &w.rel_all}) {
    if (buffer->capacity() > kKeptFloats) std::vector<float>().swap(*buffer);
  }
}

using TileFn = void (*)(const Call&, RowStats&, const Sequence&, std::int64_t, std::int64_t,
                        BackwardScratch&);

void dq_tile_portable(const Call& c, RowStats& st, const Sequence& seq, std::int64_t h,
                      std::int64_t q0, BackwardScratch& w) {
  dq_tile<PortableTraits>(c, st, seq, h, q0, w);
}
void dkdv_tile_portable(const Call& c, RowStats& st, const Sequence& seq, std::int64_t kvh,
                        std::int64_t k0, BackwardScratch& w) {
  dkdv_tile<PortableTraits>(c, st, seq, kvh, k0, w);
}
void dextra_tile_portable(const Call& c, RowStats& st, const Sequence& seq, std::int64_t kvh,
                          std::int64_t r0, BackwardScratch& w) {
  dextra_tile<PortableTraits>(c, st, seq, kvh, r0, w);
}
void fused_portable(const Call& c, RowStats& st, const Sequence& seq, std::int64_t kvh,
                    std::int64_t, BackwardScratch& w) {
  fused_task<PortableTraits>(c, st, seq, kvh, w);
}

#if FMHA_CPU_X86
FMHA_CPU_TARGET_AVX2 void dq_tile_avx2(const Call& c, RowStats& st, const Sequence& seq,
                                       std::int64_t h, std::int64_t q0, BackwardScratch& w) {
  dq_tile<Avx2Traits>(c, st, seq, h, q0, w);
}
FMHA_CPU_TARGET_AVX2 void dkdv_tile_avx2(const Call& c, RowStats& st, const Sequence& seq,
                                         std::int64_t kvh, std::int64_t k0, BackwardScratch& w) {
  dkdv_tile<Avx2Traits>(c, st, seq, kvh, k0, w);
}
FMHA_CPU_TARGET_AVX2 void dextra_tile_avx2(const Call& c, RowStats& st, const Sequence& seq,
                                           std::int64_t kvh, std::int64_t r0, BackwardScratch& w) {
  dextra_tile<Avx2Traits>(c, st, seq, kvh, r0, w);
}
FMHA_CPU_TARGET_AVX2 void fused_avx2(const Call& c, RowStats& st, const Sequence& seq,
                                     std::int64_t kvh, std::int64_t, BackwardScratch& w) {
  fused_task<Avx2Traits>(c, st, seq, kvh, w);
}
FMHA_CPU_TARGET_AVX512 void dq_tile_avx512(const Call& c, RowStats& st, const Sequence& seq,
                                           std::int64_t h, std::int64_t q0, BackwardScratch& w) {
  dq_tile<Avx512Traits>(c, st, seq, h, q0, w);
}
FMHA_CPU_TARGET_AVX512 void dkdv_tile_avx512(const Call& c, RowStats& st, const Sequence& seq,
                                             std::int64_t kvh, std::int64_t k0,
                                             BackwardScratch& w) {
  dkdv_tile<Avx512Traits>(c, st, seq, kvh, k0, w);
}
FMHA_CPU_TARGET_AVX512 void dextra_tile_avx512(const Call& c, RowStats& st, const Sequence& seq,
                                               std::int64_t kvh, std::int64_t r0,
                                               BackwardScratch& w) {
  dextra_tile<Avx512Traits>(c, st, seq, kvh, r0, w);
}
FMHA_CPU_TARGET_AVX512 void fused_avx512(const Call& c, RowStats& st, const Sequence& seq,
                                         std::int64_t kvh, std::int64_t, BackwardScratch& w) {
  fused_task<Avx512Traits>(c, st, seq, kvh, w);
}
#endif

struct TileFns {
  TileFn dq, dkdv, dextra, fused;
};

TileFns tile_fns_for(Isa isa) {
#if FMHA_CPU_X86
  if (isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16) {
    return {dq_tile_avx512, dkdv_tile_avx512, dextra_tile_avx512, fused_avx512};
  }
  if (isa == Isa::kAvx2) return {dq_tile_avx2, dkdv_tile_avx2, dextra_tile_avx2, fused_avx2};
#endif
  (void)isa;
  return {dq_tile_portable, dkdv_tile_portable, dextra_tile_portable, fused_portable};
}

// lse and Delta of every row (one task per sequence and head).
RowStats row_stats(const Call& c) {
  RowStats stats;
  stats.lse.assign(at(c.total_q * c.heads), kInf);
  stats.delta.assign(at(c.total_q * c.heads), 0.0f);
  stats.dlse.assign(at(c.total_q * c.heads), 0.0f);
  if (c.dsinks.given()) stats.p_dp.assign(at(c.total_q * c.heads), 0.0f);
  const std::int64_t tasks = static_cast<std::int64_t>(c.sequences.size()) * c.heads;
  parallel_for(tasks, c.threads, [&](std::int64_t t, int) {
    const Sequence& seq = c.sequences[at(t / c.heads)];
    const std::int64_t h = t % c.heads;
    std::vector<float> dout(at(c.value_dim)), out(at(c.value_dim));
    for (std::int64_t i = 0; i < seq.len_q; ++i) {
      const std::int64_t token = seq.first_q + i;
      const float lse = load_stat(c.lse, c.lse.offset(seq.batch, token, h));
      const std::size_t row = at((seq.row + i) * c.heads + h);
      stats.lse[row] = lse == kNegInf ? kInf : lse;
      load_features(c.dout, c.dout.offset(seq.batch, token, h), c.value_dim, 1.0f, dout.data(), 1);
      load_features(c.out, c.out.offset(seq.batch, token, h), c.value_dim, 1.0f, out.data(), 1);
      double dot = 0.0;
      for (std::int64_t d = 0; d < c.value_dim; ++d)
        dot += static_cast<double>(dout[at(d)]) * out[at(d)];
      if (c.dlse.given()) {
        stats.dlse[row] = load_stat(c.dlse, c.dlse.offset(seq.batch, token, h));
        dot -= stats.dlse[row];
      }
      stats.delta[row] = static_cast<float>(dot);
    }
  });
  return stats;
}

// dsinks[h] = -sum over sequences and rows of P_sink Delta (SPEC §11), summed in row order, with
// Delta = sum_j P dP - dlse.
void sink_gradients(const Call& c, const RowStats& stats) {
  parallel_for(c.heads, c.threads, [&](std::int64_t h, int) {
    const double sink = load_stat(c.sinks, h * c.sinks.head_stride);
    double sum = 0.0;
    for (const Sequence& seq : c.sequences) {
      for (std::int64_t i = 0; i < seq.len_q; ++i) {
        const std::size_t row = at((seq.row + i) * c.heads + h);
        sum -= std::exp(sink - stats.lse[row]) * (stats.p_dp[row] - stats.dlse[row]);
      }
    }
    store_stat(c.dsinks, h * c.dsinks.head_stride, static_cast<float>(sum));
  });
}

struct TileTask {
  TileFn fn;
  std::int64_t sequence, head, start;  // head: query head (dQ) or kv head (dK/dV)
};

void run_tiles(const Call& c, std::vector<TileTask> tasks, RowStats& stats, bool bf16_dot) {
  const auto count = static_cast<std::int64_t>(tasks.size());
  parallel_for(count, c.threads, [&](std::int64_t t, int) {
    const TileTask& task = tasks[at(t)];
    thread_local BackwardScratch w;
    w.allocate(c);
    w.bf16_dot = bf16_dot;
    task.fn(c, stats, c.sequences[at(task.sequence)], task.head, task.start, w);
  });
}

// The fused structure saves 2 of 7 products but has only sequences x kv heads tasks: kAuto takes it
// when its dQ buffer stays small and there are at least two such tasks per thread that can run
// (the machine's hardware threads, or fewer where the problem's size warrants fewer: not the
// call's thread count, so that results do not depend on FMHA_CPU_THREADS), or a single thread
// runs: a problem too small for a second thread (below backend.cpp's 6 MFLOP a backward thread) is better
// served by 5 products than by the split's parallelism.
bool use_fused(const Call& c) {
  // The fused structure's tasks each own their rows: a summed dbias runs split.
  if (c.dbias_summed()) return false;
  constexpr std::int64_t kMaxFusedBufferBytes = std::int64_t{64} << 20;
  std::int64_t tasks = 0, longest = 0;
  for (const Sequence& seq : c.sequences) {
    if (seq.len_q > 0 && seq.len_k + c.num_extra > 0) tasks += c.kv_heads;
    longest = std::max(longest, seq.len_q);
  }
  const std::int64_t buffer_bytes = c.group() * round_up(longest, kQueryTile) *
                                    round_up(c.head_dim, kLanes) * std::int64_t{sizeof(float)};
  if (buffer_bytes > kMaxFusedBufferBytes) return false;
  switch (c.backward_impl) {
    case BackwardImpl::kFused:
      return true;
    case BackwardImpl::kSplit:
      return false;
    case BackwardImpl::kAuto:
      break;
  }
  const std::int64_t runnable = std::min<std::int64_t>(
      std::max<std::int64_t>(std::thread::hardware_concurrency(), 1), c.work_threads);
  return runnable <= 1 || tasks >= 2 * runnable;
}

}  // namespace

void backward(const Call& c) {
  const Isa isa = selected_isa();
  const TileFns fns = tile_fns_for(isa);
  // Q K^T and dO V^T on bf16 pairs where the CPU has the dot product and the inputs are bf16.
  const bool bf16_dot = isa == Isa::kAvx512Bf16 && c.q.dtype == DType::kBFloat16;
  RowStats stats = row_stats(c);
  if (use_fused(c)) {
    std::vector<TileTask> tasks;
    for (std::size_t b = 0; b < c.sequences.size(); ++b) {
      for (std::int64_t kvh = 0; kvh < c.kv_heads; ++kvh)
        tasks.push_back({fns.fused, static_cast<std::int64_t>(b), kvh, 0});
    }
    run_tiles(c, std::move(tasks), stats, bf16_dot);
    if (c.dsinks.given()) sink_gradients(c, stats);
    return;
  }
  std::vector<TileTask> dkdv, dq;
  // A task starts at a first key / query, or at a neighborhood call's key / query box.
  const NeighborhoodGeometry* na = c.neighborhood;
  for (std::size_t b = 0; b < c.sequences.size(); ++b) {
    const Sequence& seq = c.sequences[b];
    const auto sequence = static_cast<std::int64_t>(b);
    const std::int64_t key_end = na != nullptr ? na->boxes(na->key_box) : seq.len_k;
    for (std::int64_t k0 = 0; k0 < key_end; k0 += na != nullptr ? 1 : kKeyTile) {
      for (std::int64_t kvh = 0; kvh < c.kv_heads; ++kvh)
        dkdv.push_back({fns.dkdv, sequence, kvh, k0});
    }
    // Extra keys' tasks, when their gradients are asked: one per tile of them and kv head.
    const bool dextra = c.dextra_k.given() || c.dextra_v.given();
    for (std::int64_t r0 = 0; dextra && r0 < c.num_extra; r0 += kKeyTile) {
      for (std::int64_t kvh = 0; kvh < c.kv_heads; ++kvh) {
        dkdv.push_back({fns.dextra, sequence, kvh, r0});
      }
    }
    // With a dbias summed over the batch (heads, query rows), the first sequence's (head's, query
    // tile's) tasks take every sequence's (head's, tile's) rows.
    const std::int64_t query_end = na != nullptr ? na->boxes(na->query_box) : seq.len_q;
    for (std::int64_t q0 = 0; q0 < query_end && (b == 0 || !c.dbias_sums[0]) &&
                              (q0 == 0 || !c.dbias_sums[2]);
         q0 += na != nullptr ? 1 : kQueryTile) {
      for (std::int64_t h = 0; h < (c.dbias_sums[1] ? 1 : c.heads); ++h)
        dq.push_back({fns.dq, sequence, h, q0});
    }
  }
  run_tiles(c, std::move(dkdv), stats, bf16_dot);
  run_tiles(c, std::move(dq), stats, bf16_dot);
  if (c.dsinks.given()) sink_gradients(c, stats);
}

}  // namespace fmha::cpu
