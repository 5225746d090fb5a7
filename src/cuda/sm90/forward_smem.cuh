// The sm90 forward block's shared memory (mainloop_fwd.cuh): Q's tile, the K/V stages, with a
// copy warpgroup the zero V tile, the output tile (or chunks) and the bias policy's ring
// (bias_ring()), then the general policy's staged bias tiles and rel-pos rows, the token-tile
// bookkeeping or the copy warpgroup's barriers. Sized here for the kernel and its launcher.
#pragma once

#include "cuda/sm90/forward_pipeline.cuh"
#include "cuda/sm90/tile_sizes.h"
#include "cuda/sm90/tiles.cuh"
#include "cuda/sm90/token_tiles.cuh"

namespace fmha::cuda::sm90 {

// The 227 KB of shared memory a block may opt into on sm90; + 1024: the dynamic shared-memory
// base is rounded up to the swizzle period.
inline constexpr int kMaxBlockSmem = 227 * 1024;
inline constexpr int kSmemAlignSlack = 1024;

// Token-tile bookkeeping of a forward block: the kernel's, and the type its launcher sizes shared
// memory and fills the column tables for (set_token_tiles). Two query boxes where a copy
// warpgroup stages the next grid tile's under the current one's math.
template <int kD, typename Policy>
using FwdTokenTiles =
    TokenTileSmem<fwd_block_m<kD, Policy>(), fwd_block_n<kD, Policy>(), kCopyWarpgroup<kD, Policy> ? 2 : 1>;

// K/V stages of a policy: tile_sizes.h's, one fewer for token tiles where their bookkeeping does
// not fit beside three (D = 128 and 224, where three leave 2 KB; 236 KB was refused on an H100),
// and two at D 128 with a copy warpgroup, so that the output has a tile of its own (output_tile()):
// the next grid tile's Q then lands under the last phase and the epilogue instead of after them.
// Measured on an H100 (2026-11-28, bf16, kernel alone, against three stages): L 512 410 -> 438
// TFLOP/s, causal L 512 249 -> 265, causal L 2048 484 -> 501, L 2048 +1.5%, L 8192 level.
template <int kD, typename Policy>
constexpr int stages_of() {
  if constexpr (kCopyWarpgroup<kD, Policy> && kD == 128) return 2;
  constexpr int stages = kv_stages(kD, kStagesScores<Policy>);
  constexpr int bytes =
      SwizzledTile<fwd_block_m<kD, Policy>(), kD>::kBytes + 2 * stages * SwizzledTile<fwd_block_n<kD, Policy>(), kD>::kBytes +
      kSmemAlignSlack + static_cast<int>(sizeof(FwdTokenTiles<kD, Policy>)) +
      (kCopyWarpgroup<kD, Policy> ? static_cast<int>(sizeof(StageBarriers<3>)) : 0) +
      (kCopyWarpgroup<kD, Policy> && kFirstPhasePv<kD, Policy>
           ? SwizzledTile<fwd_block_n<kD, Policy>(), kD>::kBytes
           : 0);
  return Policy::Mask::kTokenTiles && bytes > kMaxBlockSmem ? stages - 1 : stages;
}

// Whether the first phase of a block with a copy warpgroup reads a V tile of zeros of its own
// (kFirstPhasePv): the V stage before it holds the last tile of the block's previous grid tile.
template <int kD, typename Policy>
constexpr bool zero_v_tile() {
  return kCopyWarpgroup<kD, Policy> && kFirstPhasePv<kD, Policy>;
}

// Q, the K/V stages and the zero V tile.
template <int kD, typename Policy>
constexpr int input_smem_bytes() {
  return SwizzledTile<fwd_block_m<kD, Policy>(), kD>::kBytes +
         (2 * stages_of<kD, Policy>() + (zero_v_tile<kD, Policy>() ? 1 : 0)) *
             SwizzledTile<fwd_block_n<kD, Policy>(), kD>::kBytes;
}

// Whether a block with a copy warpgroup stages its output rows in a tile of their own (where
// shared memory has room: up to D 128), or, as the other schedule does, in Q's tile, whose next
// grid tile's copy then waits for the epilogue. Staged, the rows leave in 16-byte stores: each
// thread storing its accumulator pairs itself cost 9.5% at D 128 L 8192 (H200, 2026-11-26).
template <int kD, typename Policy>
constexpr bool output_tile() {
  return kCopyWarpgroup<kD, Policy> &&
         input_smem_bytes<kD, Policy>() + SwizzledTile<fwd_block_m<kD, Policy>(), kD>::kBytes + kSmemAlignSlack +
                 static_cast<int>(sizeof(StageBarriers<3>)) +
                 (Policy::Mask::kTokenTiles ? static_cast<int>(sizeof(FwdTokenTiles<kD, Policy>))
                                            : 0) <=
             kMaxBlockSmem;
}

// Where the output has no tile of its own (D 256: Q and two K/V stages take 192 of the 227 KB),
// a block with a copy warpgroup may still keep Q's tile out of its epilogue: each math warp stages
// its 16 rows a 64-column block at a time in two chunks of its own (OutChunk, 4 KB a warp, 32 KB
// a block), each leaving by a bulk tensor store while the next is staged. Q's tile is then free
// for the next grid tile's Q once the last product has read it, as with an output tile, instead
// of after the epilogue: the next tile's Q (64 KB at D 256) lands under the last phase and the
// epilogue instead of after them. Measured on an H200 (2026-11-29, bf16, D 256, 16k tokens,
// kernels alone, three alternating rounds): L 512 0.149 -> 0.141 ms, causal 0.146 -> 0.133; L 1024
// 0.239 -> 0.229; L 2048 0.417 -> 0.406; L 8192 level.
using OutChunk = SwizzledTile<16, 64>;
inline constexpr int kOutChunksPerWarp = 2;
template <int kD, typename Policy>
constexpr int out_chunks_bytes() {
  return fwd_block_m<kD, Policy>() / 16 * kOutChunksPerWarp * OutChunk::kBytes;
}
template <int kD, typename Policy>
constexpr bool output_chunks() {
  return kCopyWarpgroup<kD, Policy> && !output_tile<kD, Policy>() && !Policy::Mask::kTokenTiles &&
         kD % OutChunk::kBlockCols == 0 &&
         input_smem_bytes<kD, Policy>() + out_chunks_bytes<kD, Policy>() + kSmemAlignSlack +
                 static_cast<int>(sizeof(StageBarriers<3>)) <=
             kMaxBlockSmem;
}

// A staged bias tile of the copy warpgroup's ring (bias_ring()): the block's rows x a key tile,
// in the layout of a K-major operand, so that one ldmatrix gives a warp four accumulator
// fragments' pairs (score_bias.cuh).
template <int kD>
using BiasTile = SwizzledTile<block_m(kD), block_n(kD)>;

// Where the staged bias ring starts: after Q, the K/V stages, the zero V tile and the output tile
// (or chunks).
template <int kD, typename Policy>
constexpr int bias_ring_offset() {
  return input_smem_bytes<kD, Policy>() +
         (output_tile<kD, Policy>() ? SwizzledTile<fwd_block_m<kD, Policy>(), kD>::kBytes : 0) +
         (output_chunks<kD, Policy>() ? out_chunks_bytes<kD, Policy>() : 0);
}

// Shared memory of Q, the K/V stages, the zero V tile, the output tile or chunks and the staged
// bias ring; the general policy's staged bias tiles and rel-pos rows (if any), the token-tile
// bookkeeping, or the copy warpgroup's barriers follow.
template <int kD, typename Policy>
constexpr int tile_smem_bytes() {
  return bias_ring_offset<kD, Policy>() +
         (bias_ring<kD, Policy>() ? kBiasStages * BiasTile<kD>::kBytes : 0);
}

}  // namespace fmha::cuda::sm90
