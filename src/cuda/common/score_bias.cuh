// An additive bias alone (SPEC §4: no softcap or rel-pos besides it; masks allowed) in the sm90
// forward's register form: each thread loads the bias entries of its own accumulator fragment
// straight from global memory into registers, one key tile ahead of its softmax, and a score then
// costs one fused multiply-add more than the plain kernel's:
//   s = scale * q.k + bias[b, h, i, j]          (natural units; the softmax multiplies by log2(e))
// Entries j, j + 1 of a row (j even) come as one 32-bit load: the bias must have unit key stride
// and even other strides on a 4-byte aligned base (bias_registers_apply); ScoreModifiers
// (score_modifiers.cuh) covers every other layout. Staged form (sm90 up to D 64, where a tensor
// map describes the bias: forward_pipeline.cuh's bias_ring): the copy warpgroup copies each key
// tile's bias by TMA into a ring of shared-memory tiles, with barriers of its own, so ping-pong
// and the third K/V stage stay, and a thread takes its 2 x kTiles pairs in kTiles / 2 ldmatrix
// instead of 2 x kTiles global loads (fetch_staged). In the backward the dQ kernel takes its pairs
// the same way from tiles staged with each key tile's K and V (up to D 64), and the dK/dV kernel,
// whose score rows are keys, reads the bias transposed from staged tiles (bias_tiles.cuh's
// add_transposed) with the same scores; both stage by TMA where a map describes the bias.
#pragma once

#include <cstdint>

#include "cuda/common/bias_tiles.cuh"
#include "cuda/common/forward_params.h"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/score_modifiers.cuh"
#include "cuda/common/tile_primitives.cuh"

namespace fmha::cuda {

// Whether the bias fits the register form's 32-bit pair loads.
__host__ __device__ inline bool bias_registers_apply(const ForwardParams& p) {
  return p.bias != nullptr && p.bias_stride[3] == 1 && p.bias_stride[0] % 2 == 0 &&
         p.bias_stride[1] % 2 == 0 && p.bias_stride[2] % 2 == 0 &&
         reinterpret_cast<std::uintptr_t>(p.bias) % 4 == 0;
}

// One key tile's bias of a thread, as loaded: x[t][r] holds the pair of n8 tile t on row
// `row` + 8r (entries 2r, 2r + 1 of the accumulator tile), low half first.
template <int kTiles>
struct BiasFetch {
  std::uint32_t x[kTiles][2];
};

// The bias rows of a thread's two fragment rows.
struct BiasRows {
  const std::uint16_t* row[2];
};

template <typename T>
struct ScoreBias {
  float scale;                  // natural units: the bias is added unscaled
  const std::uint16_t* bias;    // already offset to (b, h)
  const ForwardParams* params;  // strides, read in place (cold)
  std::int64_t num_queries, num_keys;

  __device__ static ScoreBias make(const ForwardParams& p, std::int64_t b, std::int64_t h,
                                   std::int64_t num_queries, std::int64_t num_keys) {
    ScoreBias m;
    m.scale = p.scale_log2 * kLn2;
    m.bias =
        static_cast<const std::uint16_t*>(p.bias) + b * p.bias_stride[0] + h * p.bias_stride[1];
    m.params = &p;
    m.num_queries = num_queries;
    m.num_keys = num_keys;
    return m;
  }

  // The softmax's multiplier of the scores this policy hands it (natural units -> log2 units).
  static constexpr float kExpScale = kLog2e;

  // The rows of fragment rows `row`, row + 8; rows past the sequence read the last row (their
  // output is never stored).
  __device__ BiasRows rows(std::int64_t row) const {
    const std::int64_t stride = params->bias_stride[2];
    auto clamp = [&](std::int64_t i) { return i < num_queries ? i : num_queries - 1; };
    return {{bias + clamp(row) * stride, bias + clamp(row + 8) * stride}};
  }

  // The bias of a key tile whose thread columns start at `col` (the tile's first key plus
  // 2 (lane % 4), even): pairs (col + 8t, + 1). Keys past the sequence read nothing (zero; they
  // are masked), so a partial last tile tests each pair.
  template <int kTiles>
  __device__ void fetch(BiasFetch<kTiles>& f, const BiasRows& rows, std::int64_t col) const {
    if (col - (col & 7) + 8 * kTiles <= num_keys) {
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          f.x[t][r] = __ldg(reinterpret_cast<const unsigned int*>(rows.row[r] + col + 8 * t));
        }
      }
      return;
    }
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const std::int64_t j = col + 8 * t;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        std::uint32_t x = 0;
        if (j + 1 < num_keys) {
          x = __ldg(reinterpret_cast<const unsigned int*>(rows.row[r] + j));
        } else if (j < num_keys) {  // an odd Lk's last key: its pair would read past the row
          x = __ldg(reinterpret_cast<const unsigned short*>(rows.row[r] + j));
        }
        f.x[t][r] = x;
      }
    }
  }

  // The pairs fetch() would give, from a staged tile of the block's rows x the key tile, for the
  // warp whose 16 rows start at tile row `warp_row`; chunk(r, c) is the shared address of row r's
  // 16-byte chunk c (keys 8c .. 8c + 7): a K-major SwizzledTile (sm90/wgmma.cuh; the forward's
  // TMA ring) or bias_tiles' layout (the dQ kernel's cp.async stages). One ldmatrix.x4 reads n8
  // tiles t, t + 1 x rows 0-7, 8-15 (lanes 8i .. 8i + 7 address matrix i's rows), and a lane's
  // register of matrix i is the pair of its own fragment row and columns; both layouts put the 8
  // rows of a matrix in 8 different swizzle phases, so the reads are free of bank conflicts.
  template <int kTiles, typename ChunkAddress>
  __device__ static void fetch_staged(BiasFetch<kTiles>& f, const ChunkAddress& chunk, int warp_row,
                                      int lane) {
    static_assert(kTiles % 2 == 0, "two n8 tiles per ldmatrix");
    const int row = warp_row + (lane & 7) + (lane & 8);
    const int second = lane >> 4;  // lanes 16-31 address n8 tile t + 1
#pragma unroll
    for (int t = 0; t < kTiles; t += 2) {
      std::uint32_t x[4];
      tile::ldmatrix_x4(x, chunk(row, t + second));
      f.x[t][0] = x[0];
      f.x[t][1] = x[1];
      f.x[t + 1][0] = x[2];
      f.x[t + 1][1] = x[3];
    }
  }

  // Scale and bias of a tile of ordinary keys: s = scale * s + bias, one fused multiply-add.
  template <int kTiles>
  __device__ void scale_and_add(float (&s)[kTiles][4], const BiasFetch<kTiles>& f) const {
    using Convert = tile::Dtype<T>;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float2 b = Convert::unpack(f.x[t][r]);
        s[t][2 * r] = fmaf(s[t][2 * r], scale, b.x);
        s[t][2 * r + 1] = fmaf(s[t][2 * r + 1], scale, b.y);
      }
    }
  }

  // ---- Transposed, from staged tiles (the dK/dV kernel) ----

  // The bias pointer of rows [first_row, ..) from key first_key on, and its row stride: a staged
  // tile's source.
  __device__ const std::uint16_t* tile_source(std::int64_t first_row,
                                              std::int64_t first_key) const {
    return bias + first_row * params->bias_stride[2] + first_key;
  }

  // Scale and bias of a transposed tile (rows = keys) staged with row r's chunk c at chunk(r, c)
  // (bias_tiles::add_transposed): s = scale * s + bias, one fused multiply-add.
  template <int kTiles, typename ChunkAddress>
  __device__ void scale_and_add_tile_transposed(float (&s)[kTiles][4], const ChunkAddress& chunk,
                                                int first_key, int lane) const {
    const float k = scale;
    bias_tiles::add_transposed<T>(s, chunk, first_key, lane,
                                  [k](float x, float b) { return fmaf(x, k, b); });
  }

  // Extra keys: the scale only, in the same natural units.
  template <int kTiles>
  __device__ void transform(float (&s)[kTiles][4]) const {
    ScoreScale{scale}.transform(s);
  }
};

}  // namespace fmha::cuda
