// The tiles a task of the fast CPU kernels pairs: its own tile of queries (forward, dQ) or of keys
// (dK / dV), and the tiles of the other side that some token of its own tile sees, in a fixed
// order. A mask policy answers, for each pair, whether every score is visible (the hot loop then
// skips the mask) and otherwise hides a row's invisible scores.
//   BandTiles (dense, varlen): consecutive tokens; a band of keys per query (problem.h).
//   NeighborhoodTiles (SPEC §6): gathered tokens; query boxes of the grid and the boxes of keys
//   they see (neighborhood.h).
//   ExtraTiles (SPEC §7): a sequence's extra keys, which every query sees; a task pairs them after
//   the tiles of the policies above.
// All expose the same members, so one kernel template serves them all; kExtraKeys tells where
// their keys live (key_rows()).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/kernels.h"
#include "cpu/problem.h"

namespace fmha::cpu {

// Tokens of one sequence: `first`, first + 1, ... (gathered == nullptr) or gathered[0 .. count).
struct Tile {
  std::int64_t first = 0, count = 0;
  const std::int64_t* gathered = nullptr;

  std::int64_t token(std::int64_t j) const { return gathered != nullptr ? gathered[j] : first + j; }
};

// Where the keys of a tile policy live, and their gradients: the sequence's keys (batch, first key
// token) or its extra keys (SPEC §7: [B, R, Hkv, *], batch index the sequence's index).
struct KeyRows {
  const Operand *k, *v, *dk, *dv;
  std::int64_t batch, first;
};
template <typename Tiles>
FMHA_CPU_INLINE KeyRows key_rows(const Call& c, const Sequence& seq) {
  if constexpr (Tiles::kExtraKeys) {
    return {&c.extra_k, &c.extra_v, &c.dextra_k, &c.dextra_v, seq.index, 0};
  } else {
    return {&c.k, &c.v, &c.dk, &c.dv, seq.batch, seq.first_k};
  }
}

// Causal masks and windows: the key tiles of kKeyTile a query tile sees, or the query tiles of
// `query_tile` rows that see a key tile.
class BandTiles {
 public:
  static constexpr bool kExtraKeys = false;
  static BandTiles for_queries(const Call& c, const Sequence& seq, std::int64_t q0,
                               std::int64_t rows) {
    const Band band = Band::of(*c.options, seq.len_q, seq.len_k);
    return BandTiles(band, seq, {.first = q0, .count = rows}, true, kKeyTile, band.first_key(q0),
                     band.last_key(q0 + rows - 1, seq.len_k));
  }
  static BandTiles for_keys(const Call& c, const Sequence& seq, std::int64_t k0,
                            std::int64_t cols, std::int64_t query_tile) {
    const Band band = Band::of(*c.options, seq.len_q, seq.len_k);
    return BandTiles(band, seq, {.first = k0, .count = cols}, false, query_tile,
                     band.first_query(k0), band.last_query(k0 + cols - 1, seq.len_q));
  }

  std::int64_t count() const { return count_; }
  FMHA_CPU_INLINE Tile queries(std::int64_t t) const {
    return fixed_is_queries_ ? fixed_ : other(t, len_q_);
  }
  FMHA_CPU_INLINE Tile keys(std::int64_t t) const {
    return fixed_is_queries_ ? other(t, len_k_) : fixed_;
  }
  FMHA_CPU_INLINE bool full(std::int64_t t) const {
    const Tile q = queries(t), k = keys(t);
    return band_.covers(q.first, q.count, k.first, k.count);
  }
  // Row r of pair t's queries: its hidden scores set to -inf.
  FMHA_CPU_INLINE void hide(std::int64_t t, std::int64_t r, float* row) const {
    const Tile q = queries(t), k = keys(t);
    band_.mask_row(q.first + r, k.first, k.count, row);
  }
  // The bias and rel-pos of row r of pair t (batch index b, head h).
  FMHA_CPU_INLINE void add_terms(const Call& c, std::int64_t b, std::int64_t h, std::int64_t t,
                                 std::int64_t r, float* row) const {
    const Tile q = queries(t), k = keys(t);
    add_score_terms(c, b, h, q.first + r, k.first, k.count, row);
  }

 private:
  // The other side's tiles of `step` tokens from the one holding `first` to the one holding `last`.
  BandTiles(const Band& band, const Sequence& seq, Tile fixed, bool fixed_is_queries,
            std::int64_t step, std::int64_t first, std::int64_t last)
      : band_(band),
        fixed_(fixed),
        fixed_is_queries_(fixed_is_queries),
        step_(step),
        len_q_(seq.len_q),
        len_k_(seq.len_k),
        start_(first / step * step),
        count_(last < start_ ? 0 : (last - start_) / step + 1) {}

  FMHA_CPU_INLINE Tile other(std::int64_t t, std::int64_t length) const {
    const std::int64_t first = start_ + t * step_;
    return {.first = first, .count = std::min(step_, length - first)};
  }

  Band band_;
  Tile fixed_;
  bool fixed_is_queries_;
  std::int64_t step_, len_q_, len_k_;
  std::int64_t start_, count_;
};

// Extra keys (SPEC §7): every query sees every one of them, unmasked, without bias or rel-pos. The
// tiles of kKeyTile extra keys a query tile (consecutive or gathered) pairs with, or the tiles of
// `query_tile` consecutive queries of the sequence an extra key tile pairs with.
class ExtraTiles {
 public:
  static constexpr bool kExtraKeys = true;

  static ExtraTiles for_queries(const Call& c, const Tile& queries) {
    return ExtraTiles(queries, true, kKeyTile, c.num_extra);
  }
  static ExtraTiles for_keys(const Sequence& seq, std::int64_t r0, std::int64_t cols,
                             std::int64_t query_tile) {
    return ExtraTiles({.first = r0, .count = cols}, false, query_tile, seq.len_q);
  }

  std::int64_t count() const { return (length_ + step_ - 1) / step_; }
  FMHA_CPU_INLINE Tile queries(std::int64_t t) const { return fixed_is_queries_ ? fixed_ : other(t); }
  FMHA_CPU_INLINE Tile keys(std::int64_t t) const { return fixed_is_queries_ ? other(t) : fixed_; }
  bool full(std::int64_t) const { return true; }
  void hide(std::int64_t, std::int64_t, float*) const {}
  void add_terms(const Call&, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                 float*) const {}

 private:
  ExtraTiles(Tile fixed, bool fixed_is_queries, std::int64_t step, std::int64_t length)
      : fixed_(fixed), fixed_is_queries_(fixed_is_queries), step_(step), length_(length) {}

  FMHA_CPU_INLINE Tile other(std::int64_t t) const {
    const std::int64_t first = t * step_;
    return {.first = first, .count = std::min(step_, length_ - first)};
  }

  Tile fixed_;
  bool fixed_is_queries_;
  std::int64_t step_, length_;  // the other side's tile size and token count
};

}  // namespace fmha::cpu
