// Forward of the fast CPU backend: one task per (sequence, query head, tile of kForwardQueryTile
// queries, or a neighborhood call's box of kQueryTile).
// The task streams the key tiles its mask lets it see (tiles.h), then the sequence's extra keys
// (SPEC §7), through an fp32 online softmax (SPEC §10), so no Lq x Lk buffer exists: S = Q K^T and
// O += P V are register-blocked products on fp32 tiles, converted from the tensors' dtype once per
// tile (S of bf16 inputs on bf16 pairs where the CPU has AVX-512's bf16 dot product: bf16_dot.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
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

// Queries per forward task. Every key tile is converted (and K transposed) once per query tile, so
// a taller tile spreads that cost over more rows. One thread, B 1 H 8 L 2048 fp32 on an AMD EPYC
// (Zen 5, 2026-11-27), GFLOP per CPU second at D 64 / D 128: 64 rows 115 / 119, 256 rows 147 / 170.
constexpr std::int64_t kForwardQueryTile = 256;

// One worker's tiles, reused by every task it runs. Each worker runs on a thread of its own
// (parallel.h), which keeps them between calls (thread_local in forward()): allocating and zeroing
// them at every call was a visible part of a tiny call. They are allocated again when a call's head
// dims differ from the last call's (their padding columns are zeros that only the dims place).
struct ForwardScratch {
  std::int64_t head_dim = -1, value_dim = -1;  // the dims the tiles are laid out for
  std::vector<float> q;     // [kForwardQueryTile, D], scaled by the softmax scale
  std::vector<float> k;     // [kKeyTile, D]: K converted to fp32
  std::vector<float> kt;    // [D, kKeyTile]: K transposed, a row of keys per feature
  std::vector<float> v;     // [kKeyTile, Dv rounded up to 16], padding columns 0
  std::vector<float> s;     // [kForwardQueryTile, kKeyTile]: scores, then probabilities
  std::vector<float> o;     // [kForwardQueryTile, Dv rounded up]: unnormalised output
  std::vector<float> m, l;  // [kForwardQueryTile]: running maximum and normaliser
  // S = Q K^T on bf16 dot products (bf16_dot.h), set per call: Q as bf16 pairs
  // [kForwardQueryTile, pairs(D)], unscaled, and K transposed as pairs [pairs(D), kKeyTile] from
  // its rows of pairs k_pairs [kKeyTile, pairs(D)], in place of q, k and kt.
  bool bf16_dot = false;
  std::vector<std::uint32_t> q_pairs, k_pairs, kt_pairs;
  NeighborhoodScratch na;  // a neighborhood task's gathered tiles

  void allocate(const Call& c) {
    if (head_dim == c.head_dim && value_dim == c.value_dim) return;
    head_dim = c.head_dim;
    value_dim = c.value_dim;
    const std::int64_t dv = round_up(c.value_dim, kLanes);
    const std::int64_t pairs = pair_count(c.head_dim);
    q_pairs.assign(static_cast<std::size_t>(kForwardQueryTile * pairs), 0u);
    k_pairs.assign(static_cast<std::size_t>(kKeyTile * pairs), 0u);
    kt_pairs.assign(static_cast<std::size_t>(pairs * kKeyTile), 0u);
    q.assign(static_cast<std::size_t>(kForwardQueryTile * c.head_dim), 0.0f);
    k.assign(static_cast<std::size_t>(kKeyTile * c.head_dim), 0.0f);
    kt.assign(static_cast<std::size_t>(c.head_dim * kKeyTile), 0.0f);
    v.assign(static_cast<std::size_t>(kKeyTile * dv), 0.0f);
    s.assign(static_cast<std::size_t>(kForwardQueryTile * kKeyTile), 0.0f);
    o.assign(static_cast<std::size_t>(kForwardQueryTile * dv), 0.0f);
    m.assign(static_cast<std::size_t>(kForwardQueryTile), 0.0f);
    l.assign(static_cast<std::size_t>(kForwardQueryTile), 0.0f);
  }
};

// Writes the rows x cols block `src` (row-major) transposed into dst (dst_ld apart), columns rows
// .. ncols - 1 of dst zeroed (the products read them): in blocks of kWidth x kWidth transposed in
// registers, the ragged edges element by element. T: float, or bf16 pairs moved as 32-bit patterns.
// (Element by element throughout, K's transpose took about 8% of a one-thread fp32 forward on an
// Intel Xeon core.)
template <typename V, typename T>
FMHA_CPU_INLINE void transpose_rows(const T* src, std::int64_t rows, std::int64_t cols, T* dst,
                                    std::int64_t dst_ld, std::int64_t ncols) {
  constexpr std::int64_t kWidth = V::kWidth;
  const std::int64_t block_rows = rows / kWidth * kWidth, block_cols = cols / kWidth * kWidth;
  for (std::int64_t j0 = 0; j0 < block_rows; j0 += kWidth) {
    for (std::int64_t d0 = 0; d0 < block_cols; d0 += kWidth) {
      typename V::F r[kWidth];
      for (std::int64_t i = 0; i < kWidth; ++i) {
        if constexpr (std::is_same_v<T, float>) {
          r[i] = V::load(src + (j0 + i) * cols + d0);
        } else {
          r[i] = V::load_bits(src + (j0 + i) * cols + d0);
        }
      }
      V::transpose(r);
      for (std::int64_t i = 0; i < kWidth; ++i) {
        if constexpr (std::is_same_v<T, float>) {
          V::store(dst + (d0 + i) * dst_ld + j0, r[i]);
        } else {
          V::store_bits(dst + (d0 + i) * dst_ld + j0, r[i]);
        }
      }
    }
  }
  for (std::int64_t d = 0; d < cols; ++d) {
    T* row = dst + d * dst_ld;
    const std::int64_t first = d < block_cols ? block_rows : 0;  // before it: the blocks'
    for (std::int64_t j = first; j < rows; ++j) row[j] = src[j * cols + d];
    for (std::int64_t j = rows; j < ncols; ++j) row[j] = T{};
  }
}

// Loads the keys of `keys` (from `from`) of kv head kvh: K transposed into kt (columns keys.count
// .. ncols - 1 zeroed, the product reads them) through its converted rows k_rows, and V row-major
// into v.
template <typename V>
FMHA_CPU_INLINE void load_key_tile(const Call& c, const KeyRows& from, std::int64_t kvh,
                                   const Tile& keys, std::int64_t ncols, float* k_rows, float* kt,
                                   float* v, std::int64_t ldv) {
  const std::int64_t dim = c.head_dim, cols = keys.count;
  for (std::int64_t j = 0; j < cols; ++j) {
    const std::int64_t token = from.first + keys.token(j);
    load_features(*from.k, from.k->offset(from.batch, token, kvh), dim, 1.0f, k_rows + j * dim, 1);
    load_features(*from.v, from.v->offset(from.batch, token, kvh), c.value_dim, 1.0f, v + j * ldv,
                  1);
  }
  transpose_rows<V>(k_rows, cols, dim, kt, kKeyTile, ncols);
}

// load_key_tile for the bf16 dot products: K transposed as pairs into kt_pairs through its rows of
// pairs k_pairs (columns keys.count .. ncols - 1 zeroed, the product reads them), V row-major into
// v as fp32.
template <typename V>
FMHA_CPU_INLINE void load_key_tile_pairs(const Call& c, const KeyRows& from, std::int64_t kvh,
                                         const Tile& keys, std::int64_t ncols,
                                         std::uint32_t* k_pairs, std::uint32_t* kt_pairs, float* v,
                                         std::int64_t ldv) {
  const std::int64_t pairs = pair_count(c.head_dim), cols = keys.count;
  for (std::int64_t j = 0; j < cols; ++j) {
    const std::int64_t token = from.first + keys.token(j);
    load_bf16_pairs(*from.k, from.k->offset(from.batch, token, kvh), c.head_dim,
                    k_pairs + j * pairs, 1);
    load_features(*from.v, from.v->offset(from.batch, token, kvh), c.value_dim, 1.0f, v + j * ldv,
                  1);
  }
  transpose_rows<V>(k_pairs, cols, pairs, kt_pairs, kKeyTile, ncols);
}

// S = Q K^T of a key tile into s (rows_pad rows, ncols columns), scaled by the softmax scale: on
// bf16 pairs where w.bf16_dot says so (the scale applied to the sums), else on fp32 tiles (Q
// loaded scaled).
template <typename Traits>
FMHA_CPU_INLINE void score_tile(const Call& c, const KeyRows& from, std::int64_t kvh,
                                const Tile& keys, std::int64_t rows_pad, std::int64_t ncols,
                                ForwardScratch& w) {
  using V = typename Traits::V;
  const std::int64_t dim = c.head_dim, dv = round_up(c.value_dim, kLanes);
  float* s = w.s.data();
#if FMHA_CPU_X86
  if (w.bf16_dot) {
    const std::int64_t pairs = pair_count(dim);
    load_key_tile_pairs<V>(c, from, kvh, keys, ncols, w.k_pairs.data(), w.kt_pairs.data(),
                           w.v.data(), dv);
    gemm_bf16_pairs(rows_pad, ncols, pairs, w.q_pairs.data(), pairs, w.kt_pairs.data(), kKeyTile,
                    s, kKeyTile);
    const typename V::F scale = V::broadcast(c.scale);
    for (std::int64_t r = 0; r < rows_pad; ++r) {
      float* row = s + r * kKeyTile;
      for (std::int64_t j = 0; j < ncols; j += V::kWidth)
        V::store(row + j, V::load(row + j) * scale);
    }
    return;
  }
#endif
  load_key_tile<V>(c, from, kvh, keys, ncols, w.k.data(), w.kt.data(), w.v.data(), dv);
  gemm<Traits>(rows_pad, ncols, dim, w.q.data(), dim, 1, w.kt.data(), kKeyTile, s, kKeyTile, false);
}

// Softcap, the additive bias and rel-pos (SPEC §2), then the mask: entries the tiles' mask hides
// and padding columns become -inf. Row r of tile pair t (batch index b, head h).
template <typename V, typename Tiles>
FMHA_CPU_INLINE void finish_scores(const Call& c, const Tiles& tiles, std::int64_t b,
                                   std::int64_t h, std::int64_t t, std::int64_t r,
                                   std::int64_t cols, std::int64_t ncols, bool full, float* row) {
  if (c.softcap > 0.0f) {
    const float inverse = 1.0f / c.softcap;
    for (std::int64_t j = 0; j < ncols; j += V::kWidth)
      V::store(row + j, V::tanh(V::load(row + j) * inverse) * c.softcap);
  }
  tiles.add_terms(c, b, h, t, r, row);
  if (!full) tiles.hide(t, r, row);
  for (std::int64_t j = cols; j < ncols; ++j) row[j] = kNegInf;
}

// The online softmax step (SPEC §10) of V::kWidth consecutive rows over their finished scores
// (kKeyTile apart, ncols each; their output rows dv apart, their running maxima m and normalisers
// l consecutive): the maxima and normalisers move to the tile's, what came before is rescaled to
// the new maxima, and the rows become their probabilities. Each row's maximum and sum are first a
// vector of its chunks, then the V::kWidth vectors are transposed so that one vector holds a lane
// per row. That replaces a horizontal reduction a row (a dependent chain of lane extractions) with
// a few shuffles a row, and computes the rescale factors as one vector exponential. Measured on one core of a 2-core
// Intel Xeon (2026-11-29, fp32, B 1 H 4 L 2048 D 128 forward, one thread, three alternating runs):
// 77.4-79.6 -> 70.5-72.0 ms; the forward without any softmax runs about 63 ms.
template <typename V>
FMHA_CPU_INLINE void softmax_rows(std::int64_t ncols, float* rows, float* m, float* l, float* o,
                                  std::int64_t dv) {
  constexpr int kRows = V::kWidth;
  using F = typename V::F;
  F lanes[kRows];
  for (int i = 0; i < kRows; ++i) {
    const float* row = rows + i * kKeyTile;
    F tile_max = V::broadcast(kNegInf);
    for (std::int64_t j = 0; j < ncols; j += V::kWidth) tile_max = V::max(tile_max, V::load(row + j));
    lanes[i] = tile_max;
  }
  V::transpose(lanes);
  F row_max = lanes[0];
  for (int i = 1; i < kRows; ++i) row_max = V::max(row_max, lanes[i]);
  const F m_old = V::load(m);
  const F m_new = V::max(m_old, row_max);
  // exp(m_old - m_new), and 1 where nothing is visible yet (m_new = -inf: the row stays empty).
  const F alpha = V::exp(m_new == V::broadcast(kNegInf) ? F{} : m_old - m_new);
  alignas(64) float m_row[kRows], alpha_row[kRows];
  V::store(m_row, m_new);
  V::store(alpha_row, alpha);
  for (int i = 0; i < kRows; ++i) {
    float* row = rows + i * kKeyTile;
    F sum{};
    if (m_row[i] == kNegInf) {
      for (std::int64_t j = 0; j < ncols; ++j) row[j] = 0.0f;
    } else {
      const F shift = V::broadcast(m_row[i]);
      for (std::int64_t j = 0; j < ncols; j += V::kWidth) {
        const F p = V::exp(V::load(row + j) - shift);
        V::store(row + j, p);
        sum += p;
      }
    }
    lanes[i] = sum;
    if (alpha_row[i] != 1.0f) {
      float* orow = o + i * dv;
      const F a = V::broadcast(alpha_row[i]);
      for (std::int64_t d = 0; d < dv; d += V::kWidth) V::store(orow + d, V::load(orow + d) * a);
    }
  }
  V::transpose(lanes);
  F row_sum = lanes[0];
  for (int i = 1; i < kRows; ++i) row_sum += lanes[i];
  V::store(l, V::load(l) * alpha + row_sum);
  V::store(m, m_new);
}

// The loaded queries (rows of them, rows_pad with padding) of head h against the key tiles of
// `tiles`: the online softmax's running maximum w.m, normaliser w.l and unnormalised output w.o.
template <typename Traits, typename Tiles>
FMHA_CPU_INLINE void attend(const Call& c, const Sequence& seq, std::int64_t h, const Tiles& tiles,
                            std::int64_t rows, std::int64_t rows_pad, ForwardScratch& w) {
  using V = typename Traits::V;
  const std::int64_t dv = round_up(c.value_dim, kLanes);
  const std::int64_t kvh = h / c.group();
  const KeyRows from = key_rows<Tiles>(c, seq);
  float* s = w.s.data();
  float* o = w.o.data();
  for (std::int64_t t = 0; t < tiles.count(); ++t) {
    const Tile keys = tiles.keys(t);
    const std::int64_t cols = keys.count;
    const std::int64_t ncols = round_up(cols, kLanes);
    score_tile<Traits>(c, from, kvh, keys, rows_pad, ncols, w);

    const bool full = tiles.full(t);
    for (std::int64_t r = 0; r < rows; ++r) {
      finish_scores<V>(c, tiles, seq.index, h, t, r, cols, ncols, full, s + r * kKeyTile);
    }
    // Padding rows up to a whole block of the softmax (which covers rows_pad): every score hidden,
    // so they keep zero probabilities, their maxima and normalisers, and their output rows.
    const std::int64_t softmax_rows_end = round_up(rows, V::kWidth);
    for (std::int64_t x = rows * kKeyTile; x < softmax_rows_end * kKeyTile; ++x) s[x] = kNegInf;
    for (std::int64_t r = 0; r < softmax_rows_end; r += V::kWidth) {
      softmax_rows<V>(ncols, s + r * kKeyTile, w.m.data() + r, w.l.data() + r, o + r * dv, dv);
    }
    gemm<Traits>(rows_pad, dv, cols, s, kKeyTile, 1, w.v.data(), dv, o, dv, true);
  }
}

// The queries of `tiles` (at most kForwardQueryTile) of head h against its key tiles, then the
// sequence's extra keys.
template <typename Traits, typename Tiles>
FMHA_CPU_INLINE void forward_tile(const Call& c, const Sequence& seq, std::int64_t h,
                                  const Tiles& tiles, ForwardScratch& w) {
  const std::int64_t dim = c.head_dim, dv = round_up(c.value_dim, kLanes);
  const Tile queries = tiles.queries(0);
  const std::int64_t rows = queries.count;
  const std::int64_t rows_pad = round_up(rows, Traits::kRows);
  float* q = w.q.data();
  float* o = w.o.data();

  if (w.bf16_dot) {
    const std::int64_t pairs = pair_count(dim);
    std::uint32_t* q_pairs = w.q_pairs.data();
    for (std::int64_t r = 0; r < rows; ++r) {
      load_bf16_pairs(c.q, c.q.offset(seq.batch, seq.first_q + queries.token(r), h), dim,
                      q_pairs + r * pairs, 1);
    }
    for (std::int64_t x = rows * pairs; x < rows_pad * pairs; ++x) q_pairs[x] = 0u;
  } else {
    for (std::int64_t r = 0; r < rows; ++r) {
      load_features(c.q, c.q.offset(seq.batch, seq.first_q + queries.token(r), h), dim, c.scale,
                    q + r * dim, 1);
    }
    for (std::int64_t x = rows * dim; x < rows_pad * dim; ++x) q[x] = 0.0f;
  }
  // A sink is a logit with no value: the running maximum starts at it with exp(0) = 1 summed.
  const float sink = c.sinks.given() ? load_stat(c.sinks, h * c.sinks.head_stride) : kNegInf;
  // Every row the softmax's blocks cover (kLanes: a multiple of every ISA's block, dividing the
  // scratch's rows).
  for (std::int64_t r = 0; r < round_up(rows, kLanes); ++r) {
    w.m[static_cast<std::size_t>(r)] = sink;
    w.l[static_cast<std::size_t>(r)] = sink == kNegInf ? 0.0f : 1.0f;
  }
  for (std::int64_t x = 0; x < rows_pad * dv; ++x) o[x] = 0.0f;

  attend<Traits>(c, seq, h, tiles, rows, rows_pad, w);
  if (c.num_extra > 0) {
    attend<Traits>(c, seq, h, ExtraTiles::for_queries(c, queries), rows, rows_pad, w);
  }

  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t token = seq.first_q + queries.token(r);
    const float m = w.m[static_cast<std::size_t>(r)], l = w.l[static_cast<std::size_t>(r)];
    // A row that sees no key and no sink has l = 0: out 0, lse -inf (SPEC §10).
    const float inverse = l > 0.0f ? 1.0f / l : 0.0f;
    store_features(c.out, c.out.offset(seq.batch, token, h), c.value_dim, o + r * dv, inverse);
    if (c.lse.given()) {
      store_stat(c.lse, c.lse.offset(seq.batch, token, h), l > 0.0f ? m + std::log(l) : kNegInf);
    }
  }
}

// One task: queries q0 .. q0 + kForwardQueryTile - 1 of a band, or query box `start` of a
// neighborhood grid.
template <typename Traits>
FMHA_CPU_INLINE void forward_task(const Call& c, const Sequence& seq, std::int64_t h,
                                  std::int64_t start, ForwardScratch& w) {
  if (c.neighborhood != nullptr) {
    forward_tile<Traits>(c, seq, h, NeighborhoodTiles::for_queries(*c.neighborhood, start, w.na),
                         w);
    return;
  }
  const std::int64_t rows = std::min(kForwardQueryTile, seq.len_q - start);
  forward_tile<Traits>(c, seq, h, BandTiles::for_queries(c, seq, start, rows), w);
}

using ForwardTileFn = void (*)(const Call&, const Sequence&, std::int64_t, std::int64_t,
                               ForwardScratch&);

void forward_tile_portable(const Call& c, const Sequence& seq, std::int64_t h, std::int64_t q0,
                           ForwardScratch& w) {
  forward_task<PortableTraits>(c, seq, h, q0, w);
}

#if FMHA_CPU_X86
FMHA_CPU_TARGET_AVX2 void forward_tile_avx2(const Call& c, const Sequence& seq, std::int64_t h,
                                            std::int64_t q0, ForwardScratch& w) {
  forward_task<Avx2Traits>(c, seq, h, q0, w);
}

FMHA_CPU_TARGET_AVX512 void forward_tile_avx512(const Call& c, const Sequence& seq, std::int64_t h,
                                                std::int64_t q0, ForwardScratch& w) {
  forward_task<Avx512Traits>(c, seq, h, q0, w);
}
#endif

ForwardTileFn forward_tile_for(Isa isa) {
#if FMHA_CPU_X86
  if (isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16) return forward_tile_avx512;
  if (isa == Isa::kAvx2) return forward_tile_avx2;
#endif
  (void)isa;
  return forward_tile_portable;
}

// One task of the forward: a query tile (a first query, or a neighborhood box) of one head of one
// sequence.
struct ForwardTask {
  std::int64_t sequence, head, start;
};

}  // namespace

void forward(const Call& c) {
  const Isa isa = selected_isa();
  const ForwardTileFn tile = forward_tile_for(isa);
  // Q K^T on bf16 pairs where the CPU has the dot product and Q and K are bf16 (extra keys share
  // K's dtype).
  const bool bf16_dot = isa == Isa::kAvx512Bf16 && c.q.dtype == DType::kBFloat16;
  std::vector<ForwardTask> tasks;
  for (std::size_t b = 0; b < c.sequences.size(); ++b) {
    const std::int64_t step = c.neighborhood != nullptr ? 1 : kForwardQueryTile;
    const std::int64_t end = c.neighborhood != nullptr
                                 ? c.neighborhood->boxes(c.neighborhood->query_box)
                                 : c.sequences[b].len_q;
    for (std::int64_t start = 0; start < end; start += step) {
      for (std::int64_t h = 0; h < c.heads; ++h)
        tasks.push_back({static_cast<std::int64_t>(b), h, start});
    }
  }
  // Under a causal mask later tiles see more keys: handing them out first balances the threads.
  // The order changes who computes a tile, never how.
  if (c.options->causal) {
    std::stable_sort(tasks.begin(), tasks.end(),
                     [](const ForwardTask& a, const ForwardTask& b) { return a.start > b.start; });
  }
  const auto count = static_cast<std::int64_t>(tasks.size());
  parallel_for(count, c.threads, [&](std::int64_t t, int) {
    const ForwardTask& task = tasks[static_cast<std::size_t>(t)];
    thread_local ForwardScratch w;
    w.allocate(c);
    w.bf16_dot = bf16_dot;
    tile(c, c.sequences[static_cast<std::size_t>(task.sequence)], task.head, task.start, w);
  });
}

}  // namespace fmha::cpu
