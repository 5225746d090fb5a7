// SAM-style decomposed relative-position bias alone (SPEC §5: no bias, softcap or mask besides it),
// laid out so that it costs about one extra instruction per score:
//   s = scale * q.k + rel_h[i, j / Wk] + rel_w[i, j % Wk]          (log2 units)
// Two forms, both for a power-of-two Wk that divides the key tile, so that every key tile starts at
// j % Wk = 0 and the rel_w entries of a thread's columns are the same in every tile:
// - The forward's register form (rel_pos_registers_apply: Wk = kN / 2, a key tile is two grid
//   rows, SAM's 64 x 64 grid under 128-key tiles): the thread's rel_w entries sit in registers
//   for the whole block (load_rel_w), a score takes one fused multiply-add (scale, rel_w), and
//   rel_h, constant over each half of a tile, is folded into the half's exponent base by the
//   forward's softmax (four 16-bit loads a tile, fetched one tile ahead: fetch_rel_h).
// - The backward's staged form (rel_pos_tiles_apply: Wk from 8 to the key tile): the block's rows
//   are staged once in shared memory, rel_h as fp32 already scaled by log2(e), rel_w in its own
//   16-bit type, two entries a word: a score then takes half a word load, a conversion and a
//   fused multiply-add next to the scale's.
// ScoreModifiers (score_modifiers.cuh) covers every other layout and combination.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/forward_params.h"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/score_modifiers.cuh"
#include "cuda/common/tile_primitives.cuh"

namespace fmha::cuda {

// Row pitch (32-bit words) of the staged rows: rel_h (fp32), then rel_w (16-bit pairs); 4 modulo
// 32, so that a warp's 8 rows x 4 pair loads fall in distinct banks, as do its 8 rows' rel_h loads.
__host__ __device__ constexpr std::int64_t rel_pos_tile_pitch(std::int64_t rel_h_size,
                                                              std::int64_t rel_w_size) {
  return (rel_h_size + rel_w_size / 2 + 27) / 32 * 32 + 4;
}

// Row pitch (floats) of the backward's drel_w table: 8 modulo 32, so that each half-warp's 4 rows x
// 4 float pairs fall in distinct banks.
__host__ __device__ constexpr std::int64_t rel_pos_grad_pitch(std::int64_t rel_w_size) {
  return (rel_w_size + 23) / 32 * 32 + 8;
}

// Row pitch (bytes) of the backward dK/dV kernel's staged rel_w rows: whole 16-byte chunks plus
// 16 bytes (rel_h entries, rel_h_staged_in_pairs). Widths up to 64 all take 64's pitch, a
// compile-time constant there (a row's address is then an immediate offset, not a multiply per
// element); 144 bytes is 16 modulo 128, so that the 8 rows of a transposing ldmatrix fall in
// distinct banks.
inline constexpr int kNarrowRelRowsPitch = 2 * 64 + 16;
__host__ __device__ constexpr int rel_w_rows_pitch(std::int64_t rel_w_size) {
  return rel_w_size <= 64 ? kNarrowRelRowsPitch : static_cast<int>(2 * rel_w_size + 16);
}

// Whether rel_w rows can be copied 16 bytes at a time (the dK/dV kernel's staging).
__host__ __device__ inline bool rel_w_staged_in_chunks(const ForwardParams& p) {
  return p.rel_w_stride[3] == 1 && p.rel_w_stride[0] % 8 == 0 && p.rel_w_stride[1] % 8 == 0 &&
         p.rel_w_stride[2] % 8 == 0 && reinterpret_cast<std::uintptr_t>(p.rel_w) % 16 == 0;
}

// Whether the dK/dV kernel also stages the rel_h entries its 128 keys meet (128 / Wk per query
// row, in the 16 bytes after each staged rel_w row) with 4-byte copies: 2 to 8 entries (Wk 16 to
// 64), contiguous and 4-byte aligned. Otherwise they are read from global memory per score.
__host__ __device__ inline bool rel_h_staged_in_pairs(const ForwardParams& p, int keys_per_block) {
  return p.rel_w_size >= 16 && p.rel_w_size <= 64 && keys_per_block % p.rel_w_size == 0 &&
         p.rel_h_stride[3] == 1 && p.rel_h_stride[0] % 2 == 0 && p.rel_h_stride[1] % 2 == 0 &&
         p.rel_h_stride[2] % 2 == 0 && reinterpret_cast<std::uintptr_t>(p.rel_h) % 4 == 0;
}

// Whether a problem's rel-pos fits the staged layout for key tiles of kN keys.
__host__ __device__ constexpr bool rel_pos_tiles_apply(std::int64_t rel_w_size, int kN) {
  return rel_w_size >= 8 && rel_w_size <= kN && (rel_w_size & (rel_w_size - 1)) == 0;
}

// Whether it fits the register form for key tiles of kN keys with kGridRows grid rows each (the
// forward: two; the backward dQ kernel: one or two).
template <int kGridRows = 2>
__host__ __device__ constexpr bool rel_pos_registers_apply(std::int64_t rel_w_size, int kN) {
  return rel_w_size >= 8 && kGridRows * rel_w_size == kN;
}

// The register form's rel_h of one key tile, as loaded: [row, row + 8][grid row of the tile];
// and the two rows it is loaded from.
template <int kGridRows = 2>
struct RelHFetch {
  std::uint16_t x[2][kGridRows];
};
struct RelHRows {
  const std::uint16_t* row[2];
};

template <typename T>
struct ScoreRelPos {
  float scale_log2;
  const std::uint16_t* rel_h;  // already offset to (b, h)
  const std::uint16_t* rel_w;
  const ForwardParams* params;  // strides, read in place (cold)
  std::int64_t num_queries;
  int rel_h_size, rel_w_size, pitch;
  const std::uint32_t* staged;  // the block's rows, from stage()
  std::int64_t staged_first_row;

  __device__ static ScoreRelPos make(const ForwardParams& p, std::int64_t b, std::int64_t h,
                                     std::int64_t num_queries, std::int64_t num_keys) {
    ScoreRelPos m;
    m.scale_log2 = p.scale_log2;
    m.rel_h =
        static_cast<const std::uint16_t*>(p.rel_h) + b * p.rel_h_stride[0] + h * p.rel_h_stride[1];
    m.rel_w =
        static_cast<const std::uint16_t*>(p.rel_w) + b * p.rel_w_stride[0] + h * p.rel_w_stride[1];
    m.params = &p;
    m.num_queries = num_queries;
    m.rel_w_size = static_cast<int>(p.rel_w_size);
    m.rel_h_size = static_cast<int>((num_keys + p.rel_w_size - 1) / p.rel_w_size);
    m.pitch = static_cast<int>(rel_pos_tile_pitch(m.rel_h_size, m.rel_w_size));
    m.staged = nullptr;
    m.staged_first_row = 0;
    return m;
  }

  // ---- The register form (rel_pos_registers_apply) ----
  // Entries 0, 1 of a thread's n8 tile t are on `row`, 2, 3 on row + 8, entry 0 on key column
  // 8t + col of the tile (col = 2 * (lane % 4)); with two grid rows a tile, tiles t and
  // t + kTiles / 2 sit on the same grid column, one grid row apart. Rows past the sequence read the
  // last row's entries (their output is never stored), keys past it the last grid row's (they
  // are masked).

  // This thread's rel_w entries in log2 units: w[t][e] for the n8 tiles of one grid row.
  template <int kRowTiles>
  __device__ void load_rel_w(float (&w)[kRowTiles][4], std::int64_t row, int col) const {
    using Convert = tile::Dtype<T>;
    const std::int64_t row_stride = params->rel_w_stride[2], col_stride = params->rel_w_stride[3];
    const std::uint16_t* const w0 = rel_w + clamp_row(row) * row_stride + col * col_stride;
    const std::uint16_t* const w8 = rel_w + clamp_row(row + 8) * row_stride + col * col_stride;
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const std::int64_t offset = (8 * t + e) * col_stride;
        w[t][e] = Convert::to_float(w0[offset]) * kLog2e;
        w[t][2 + e] = Convert::to_float(w8[offset]) * kLog2e;
      }
    }
  }

  // The rel_h rows of rows `row` and row + 8, for fetch_rel_h (set up once: the per-tile fetch
  // then only adds column offsets, where the row arithmetic cost 26 IMADs a tile).
  __device__ RelHRows rel_h_rows(std::int64_t row) const {
    const std::int64_t row_stride = params->rel_h_stride[2];
    return {{rel_h + clamp_row(row) * row_stride, rel_h + clamp_row(row + 8) * row_stride}};
  }

  // rel_h of the grid rows of the key tile starting at first_key (a multiple of kGridRows Wk,
  // below 2^31: the launchers' bound), as raw 16-bit values: issued one tile ahead of
  // rel_h_offsets.
  template <int kGridRows>
  __device__ RelHFetch<kGridRows> fetch_rel_h(const RelHRows& rows, std::int64_t first_key) const {
    const std::int64_t col_stride = params->rel_h_stride[3];
    const int jh = static_cast<int>(first_key) >> rel_w_shift();
    RelHFetch<kGridRows> f;
#pragma unroll
    for (int g = 0; g < kGridRows; ++g) {
      const std::int64_t c = (jh + g < rel_h_size ? jh + g : rel_h_size - 1) * col_stride;
#pragma unroll
      for (int r = 0; r < 2; ++r) f.x[r][g] = rows.row[r][c];
    }
    return f;
  }

  // The fetched rel_h in log2 units: offset[r][g], the per-row offsets of the tile's grid rows.
  template <int kGridRows>
  __device__ void rel_h_offsets(const RelHFetch<kGridRows>& f,
                                float (&offset)[2][kGridRows]) const {
    using Convert = tile::Dtype<T>;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int g = 0; g < kGridRows; ++g) offset[r][g] = Convert::to_float(f.x[r][g]) * kLog2e;
    }
  }

  // Scale and rel_w of a tile of ordinary keys: s = scale * s + rel_w, one fused multiply-add.
  template <int kTiles, int kRowTiles>
  __device__ void scale_and_add_w(float (&s)[kTiles][4], const float (&w)[kRowTiles][4]) const {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] = fmaf(s[t][e], scale_log2, w[t % kRowTiles][e]);
    }
  }

  // log2(Wk): both forms take power-of-two widths, so a key's grid row is a shift, not a 64-bit
  // division (a subroutine call).
  __device__ int rel_w_shift() const {
    return __ffs(rel_w_size) - 1;
  }

  __device__ std::int64_t clamp_row(std::int64_t row) const {
    return row < num_queries ? row : num_queries - 1;
  }

  // Extra keys (both forms): the scale only.
  template <int kTiles>
  __device__ void transform(float (&s)[kTiles][4]) const {
    ScoreScale{scale_log2}.transform(s);
  }

  // ---- The backward's staged form (rel_pos_tiles_apply) ----

  // Stages rows [first_row, first_row + rows) (layout above), zeros past the sequence. Every
  // thread of the block calls it; the caller's next barrier publishes the rows. Latency-bound (one
  // block per SM, nothing overlaps it): each thread issues kBatch words' loads before it converts
  // and stores them, branch-free (rows past the sequence read row first_row, rel_h words read
  // their entry twice), where one dependent load a word took a sixth of the forward's stall
  // samples (Nsight Compute, SAM-B, when the forward still staged).
  __device__ void stage(std::uint32_t* smem, std::int64_t first_row, int rows) {
    using Convert = tile::Dtype<T>;
    constexpr int kBatch = 8;
    const int width = rel_h_size + rel_w_size / 2;
    const int total = rows * width;
    const int threads = static_cast<int>(blockDim.x);
    const std::int64_t h_row = params->rel_h_stride[2], h_col = params->rel_h_stride[3];
    const std::int64_t w_row = params->rel_w_stride[2], w_col = params->rel_w_stride[3];
    for (int first = static_cast<int>(threadIdx.x); first < total; first += kBatch * threads) {
      std::uint16_t lo[kBatch], hi[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int index = first + k * threads < total ? first + k * threads : 0;
        const int r = index / width;
        const int c = index - r * width;
        const std::int64_t i = first_row + r < num_queries ? first_row + r : first_row;
        const std::uint16_t* x = c < rel_h_size ? rel_h + i * h_row + c * h_col
                                                : rel_w + i * w_row + 2 * (c - rel_h_size) * w_col;
        lo[k] = x[0];
        hi[k] = x[c < rel_h_size ? 0 : w_col];
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int index = first + k * threads;
        if (index >= total) break;
        const int r = index / width;
        const int c = index - r * width;
        std::uint32_t word = 0;
        if (first_row + r < num_queries) {
          word = c < rel_h_size ? __float_as_uint(Convert::to_float(lo[k]) * kLog2e)
                                : lo[k] | (static_cast<std::uint32_t>(hi[k]) << 16);
        }
        smem[r * pitch + c] = word;
      }
    }
    staged = smem;
    staged_first_row = first_row;
  }

  // Scale and rel-pos of a tile of ordinary keys starting at first_key (a multiple of Wk):
  // entries 0, 1 of this thread on `row`, 2, 3 on row + 8; entry 0 of n8 tile t on key column
  // first_key + 8t + col (col = 2 * (lane % 4)). Keys past the sequence read a clamped rel_h
  // entry and are masked by the caller. A tile of one or two grid rows (SAM's Wk = 64 under the
  // dQ kernel's 64- and 128-key tiles) runs the same code with the width a constant, so that
  // its per-n8-tile branches and offsets fold at compile time.
  template <int kTiles>
  __device__ void scale_and_add(float (&s)[kTiles][4], std::int64_t row, std::int64_t first_key,
                                int col) const {
    with_tile_width<kTiles>(
        [&](auto width) { scale_and_add_width<decltype(width)::value>(s, row, first_key, col); });
  }

  // Calls f(std::integral_constant<int, W>{}) with W = Wk when a tile of kTiles n8 tiles is one or
  // two grid rows, else W = 0 (the width read at run time): the staged form's per-tile code with
  // the width a constant, so that its per-n8-tile branches and offsets fold at compile time.
  template <int kTiles, typename F>
  __device__ __forceinline__ void with_tile_width(F&& f) const {
    if (rel_w_size == kTiles * 8) {
      f(std::integral_constant<int, kTiles * 8>{});
    } else if (rel_w_size == kTiles * 4) {
      f(std::integral_constant<int, kTiles * 4>{});
    } else {
      f(std::integral_constant<int, 0>{});
    }
  }

  // kWidth: Wk when a compile-time constant, else 0 (with_tile_width).
  template <int kWidth, int kTiles>
  __device__ __forceinline__ void scale_and_add_width(float (&s)[kTiles][4], std::int64_t row,
                                                      std::int64_t first_key, int col) const {
    using Convert = tile::Dtype<T>;
    const std::uint32_t* row0 = staged + (row - staged_first_row) * pitch;
    const std::uint32_t* row8 = row0 + 8 * pitch;
    const std::uint32_t* w0 = row0 + rel_h_size + col / 2;
    const std::uint32_t* w8 = row8 + rel_h_size + col / 2;
    const int mask = (kWidth > 0 ? kWidth : rel_w_size) - 1;
    int jh = static_cast<int>(first_key >> rel_w_shift());
    float h0 = 0.0f, h8 = 0.0f;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const int jw = (t * 8) & mask;
      if (jw == 0) {  // the tile's first or next grid row (keys past the sequence: clamped)
        if (t > 0) ++jh;
        const int hh = jh < rel_h_size ? jh : rel_h_size - 1;
        h0 = __uint_as_float(row0[hh]);
        h8 = __uint_as_float(row8[hh]);
      }
      const float2 a = Convert::unpack(w0[jw / 2]);
      const float2 c = Convert::unpack(w8[jw / 2]);
      s[t][0] = fmaf(s[t][0], scale_log2, fmaf(a.x, kLog2e, h0));
      s[t][1] = fmaf(s[t][1], scale_log2, fmaf(a.y, kLog2e, h0));
      s[t][2] = fmaf(s[t][2], scale_log2, fmaf(c.x, kLog2e, h8));
      s[t][3] = fmaf(s[t][3], scale_log2, fmaf(c.y, kLog2e, h8));
    }
  }

  // Copies rel_w of queries [first_row, first_row + kRows) of head `h` (rows pitch bytes apart,
  // zeros past the sequence) to shared address `dst` with 16-byte cp.async: the backward dK/dV
  // kernel's per-query-tile rows (rel_w_staged_in_chunks() must hold). `this` is any head's.
  // With `h_staged` (rel_h_staged_in_pairs), each row's 16 bytes after rel_w get rel_h entries
  // first_key / Wk .. + kKeys / Wk - 1: those of the block's kKeys keys.
  template <int kRows, int kKeys, int kThreads>
  __device__ void load_rel_w_async(std::uint32_t dst, int pitch_bytes, std::int64_t b,
                                   std::int64_t h, std::int64_t first_row, bool h_staged,
                                   std::int64_t first_key) const {
    const std::uint16_t* const w = static_cast<const std::uint16_t*>(params->rel_w) +
                                   b * params->rel_w_stride[0] + h * params->rel_w_stride[1];
    const int chunks = rel_w_size / 8;
    for (int index = static_cast<int>(threadIdx.x); index < kRows * chunks; index += kThreads) {
      const int r = index / chunks;
      const int c = index - r * chunks;
      const std::int64_t i = first_row + r;
      const bool inside = i < num_queries;
      tile::cp_async_16(dst + r * pitch_bytes + c * 16,
                        inside ? w + i * params->rel_w_stride[2] + c * 8 : w, inside ? 16 : 0);
    }
    if (!h_staged) return;
    const int first_jh = static_cast<int>(first_key >> rel_w_shift());
    const std::uint16_t* const rh = rel_h_row0(b, h) + first_jh;
    const int pairs = kKeys / rel_w_size / 2;
    for (int index = static_cast<int>(threadIdx.x); index < kRows * pairs; index += kThreads) {
      const int r = index / pairs;
      const int c = index - r * pairs;
      const std::int64_t i = first_row + r;
      // Entries past the grid's last row (the block's keys past Lk) are zero-filled, not read.
      const int left = rel_h_size - first_jh - 2 * c;
      const int bytes = i < num_queries ? (left >= 2 ? 4 : (left == 1 ? 2 : 0)) : 0;
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + r * pitch_bytes +
                                                                          2 * rel_w_size + 4 * c),
                   "l"(bytes > 0 ? rh + i * params->rel_h_stride[2] + 2 * c : rh), "r"(bytes));
    }
  }

  // rel_h of (b, h), row 0.
  __device__ const std::uint16_t* rel_h_row0(std::int64_t b, std::int64_t h) const {
    return static_cast<const std::uint16_t*>(params->rel_h) + b * params->rel_h_stride[0] +
           h * params->rel_h_stride[1];
  }

  // Rel-pos added to a transposed tile (rows = keys: entries 0, 1 of this thread on `key`, 2, 3
  // on key + 8; entry 0 of n8 tile t on query `query` + 8t, the tile's local column
  // `local_query` + 8t), for head h: rel_w from the query tile's staged rows (`rows`, pitch_bytes
  // apart), rel_h from global memory, one load per query when both keys share a grid row. Keys
  // and queries past the sequence get nothing.
  // With `h_staged`, rel_h comes from the rows' staged entries of the block's keys (the block
  // starts at key `first_key`; load_rel_w_async).
  template <int kTiles>
  __device__ void add_transposed(float (&s)[kTiles][4], std::int64_t b, std::int64_t h,
                                 std::int64_t key, std::int64_t query, int local_query,
                                 const std::uint8_t* rows, int pitch_bytes, std::int64_t num_keys,
                                 bool h_staged, std::int64_t first_key, std::uint32_t rows_smem,
                                 int lane) const {
    using Convert = tile::Dtype<T>;
    const std::uint16_t* const rh = rel_h_row0(b, h);
    const std::int64_t h_row = params->rel_h_stride[2], h_col = params->rel_h_stride[3];
    const std::int64_t jh0 = key >> rel_w_shift(), jh8 = (key + 8) >> rel_w_shift();
    const int jw0 = static_cast<int>(key - jh0 * rel_w_size);
    const int jw8 = static_cast<int>(key + 8 - jh8 * rel_w_size);
    const bool valid0 = key < num_keys, valid8 = key + 8 < num_keys;
    const std::uint16_t* const h0 = rh + (valid0 ? jh0 : 0) * h_col;
    const std::uint16_t* const h8 = rh + (valid8 ? jh8 : 0) * h_col;
    const bool same_row = jh0 == jh8;
    // Staged: the entry of a row's rel_h slice (after its rel_w) for both keys.
    const int first_jh = static_cast<int>(first_key >> rel_w_shift());
    const int staged0 = rel_w_size + static_cast<int>(jh0) - first_jh;
    if (h_staged) {
      // rel_w pairs by one transposing ldmatrix per two query tiles (as the bias tiles': its
      // 8 x 8 matrices are (query tile, key half); Wk >= 16 keeps the warp's 16 keys one run of
      // grid columns), rel_h from each row's staged slice, rows kNarrowRelRowsPitch apart (Wk <=
      // 64). A thread's two keys share their grid row (warps start at multiples of 16 keys and
      // Wk >= 16, so key % Wk + 8 < Wk): one rel_h entry a query serves both. Branch-free: keys
      // and queries past the sequence read zero-filled or finite entries and are masked after.
      constexpr int kPitch = kNarrowRelRowsPitch;
      const int m = lane / 8;
      const int jw_first = jw0 - lane / 4;
      const std::uint32_t col_bytes = 2 * (jw_first + 8 * (m & 1));
      const std::uint8_t* const h_entry = rows + local_query * kPitch + 2 * staged0;
#pragma unroll
      for (int t = 0; t < kTiles; t += 2) {
        std::uint32_t x[4];
        tile::ldmatrix_x4_trans(x, rows_smem + (8 * (t + m / 2) + lane % 8) * kPitch + col_bytes);
#pragma unroll
        for (int q = 0; q < 2; ++q) {  // query tile t + q: matrices 2q (key half 0), 2q + 1
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float hv = Convert::to_float(
                *reinterpret_cast<const std::uint16_t*>(h_entry + (8 * (t + q) + e) * kPitch));
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const std::uint32_t pair = x[2 * q + half];
              const float wv =
                  Convert::to_float(static_cast<std::uint16_t>(e == 0 ? pair : pair >> 16));
              s[t + q][2 * half + e] = fmaf(hv + wv, kLog2e, s[t + q][2 * half + e]);
            }
          }
        }
      }
      return;
    }
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const std::int64_t i = query + 8 * t + e;
        if (i >= num_queries) continue;
        const auto* w =
            reinterpret_cast<const std::uint16_t*>(rows + (local_query + 8 * t + e) * pitch_bytes);
        const float a = Convert::to_float(h0[i * h_row]);
        const float c = same_row ? a : Convert::to_float(h8[i * h_row]);
        if (valid0) s[t][e] += (a + Convert::to_float(w[jw0])) * kLog2e;
        if (valid8) s[t][2 + e] += (c + Convert::to_float(w[jw8])) * kLog2e;
      }
    }
  }

  // The backward's gradients of a tile: dS (layout as scale_and_add, the gradient wrt the final
  // score) summed over each grid row into drel_h and over each grid column into drel_w.
  //   drel_h: a grid row's keys all lie in one tile (Wk divides the tile), so its sum over the
  //     row's 8-column groups and the quad's 4 threads is complete here: lane c == 0 writes it to
  //     dh0 / dh8 (the gradient's rows, entries dh_col apart, in T; nullptr for rows past the
  //     sequence or without drel_h).
  //   drel_w: this thread's columns meet the same Wk entries in every tile, so each (row, jw) has
  //     one owner: it adds into its own slots dw0 / dw8 of a per-block shared table (nullptr
  //     without drel_w); the caller stores the table after the last tile.
  // One or two grid rows a tile: the width a constant (with_tile_width); with two, tiles t and
  // t + Wk / 8 meet the same drel_w slots and are summed in registers first (one shared-memory
  // read-modify-write a slot and tile instead of two).
  template <int kTiles>
  __device__ void accumulate_grads(const float (&ds)[kTiles][4], std::int64_t first_key, int col,
                                   std::uint16_t* dh0, std::uint16_t* dh8, std::int64_t dh_col,
                                   float* dw0, float* dw8) const {
    with_tile_width<kTiles>([&](auto width) {
      accumulate_grads_width<decltype(width)::value>(ds, first_key, col, dh0, dh8, dh_col, dw0,
                                                     dw8);
    });
  }
  // kWidth: Wk when a compile-time constant, else 0 (with_tile_width).
  template <int kWidth, int kTiles>
  __device__ __forceinline__ void accumulate_grads_width(const float (&ds)[kTiles][4],
                                                         std::int64_t first_key, int col,
                                                         std::uint16_t* dh0, std::uint16_t* dh8,
                                                         std::int64_t dh_col, float* dw0,
                                                         float* dw8) const {
    using Convert = tile::Dtype<T>;
    const int mask = (kWidth > 0 ? kWidth : rel_w_size) - 1;
    int jh = static_cast<int>(first_key >> rel_w_shift());
    float h0 = 0.0f, h8 = 0.0f;
    auto flush = [&]() {  // warp-uniform: every lane reaches it at the same t
      h0 += __shfl_xor_sync(0xffffffffu, h0, 1);
      h0 += __shfl_xor_sync(0xffffffffu, h0, 2);
      h8 += __shfl_xor_sync(0xffffffffu, h8, 1);
      h8 += __shfl_xor_sync(0xffffffffu, h8, 2);
      if (col == 0 && jh < rel_h_size) {
        if (dh0 != nullptr) dh0[jh * dh_col] = Convert::from_float(h0);
        if (dh8 != nullptr) dh8[jh * dh_col] = Convert::from_float(h8);
      }
    };
    auto add_to_slots = [&](int jw, float2 a, float2 c) {
      float2* const x = reinterpret_cast<float2*>(dw0 + jw + col);
      float2* const y = reinterpret_cast<float2*>(dw8 + jw + col);
      const float2 u = *x, v = *y;
      *x = make_float2(u.x + a.x, u.y + a.y);
      *y = make_float2(v.x + c.x, v.y + c.y);
    };
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const int jw = (t * 8) & mask;
      if (t > 0 && jw == 0) {
        flush();
        h0 = h8 = 0.0f;
        ++jh;
      }
      h0 += ds[t][0] + ds[t][1];
      h8 += ds[t][2] + ds[t][3];
      if constexpr (kWidth == 0 || kWidth == kTiles * 8) {
        if (dw0 != nullptr) {
          add_to_slots(jw, make_float2(ds[t][0], ds[t][1]), make_float2(ds[t][2], ds[t][3]));
        }
      }
    }
    flush();
    if constexpr (kWidth > 0 && kWidth < kTiles * 8) {
      constexpr int kPeriod = kWidth / 8;  // n8 tiles a grid row
      if (dw0 != nullptr) {
#pragma unroll
        for (int t0 = 0; t0 < kPeriod; ++t0) {
          float2 a = make_float2(0.0f, 0.0f), c = make_float2(0.0f, 0.0f);
#pragma unroll
          for (int t = t0; t < kTiles; t += kPeriod) {
            a = make_float2(a.x + ds[t][0], a.y + ds[t][1]);
            c = make_float2(c.x + ds[t][2], c.y + ds[t][3]);
          }
          add_to_slots(8 * t0, a, c);
        }
      }
    }
  }
};

}  // namespace fmha::cuda
