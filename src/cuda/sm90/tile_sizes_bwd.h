// Tile-size choices of the sm90 (wgmma) backward kernels, one place, each with its reason.
// The split structure (a dK/dV kernel and a dQ kernel, no atomics): every product keeps its
// accumulator in registers, and each kernel is the forward's loop with one more product. The fused
// structure is the dK/dV kernel with the same tiles and one more product (fused_dq.cuh).
#pragma once

#include <cstdint>

#include "cuda/common/forward_params.h"
#include "cuda/common/score_rel_pos.cuh"

namespace fmha::cuda::sm90 {

// Head-dim buckets the sm90 backward takes: all of them. Up to D = 128 a dK/dV block keeps dK and
// dV of its 64 keys a warpgroup (D / 2 floats a thread each) next to two score tiles. Above, both
// do not fit in registers, so the dK/dV work is split by output into two kernels (DkDvPart): one
// accumulates dV (S^T, then dV += P^T dO: two products a tile), the other dK (S^T and dP^T, then
// dK += dS^T Q: three), D / 2 floats a thread each. That is 5 products a tile pair at D = 256
// where two column chunks of both outputs, each recomputing S^T and dP^T, took 6 (H200,
// 2026-11-26: the two chunk kernels took 4.05 + 4.03 ms of an 11.3 ms backward at L 8192).
inline constexpr int kBwdMaxHeadDim = 256;
enum class DkDvPart { kBoth, kDv, kDk };
constexpr int bwd_num_parts(int head_dim_bucket) { return head_dim_bucket <= 128 ? 1 : 2; }
// Neighborhood attention: up to D = 128 (one part; the token-tile bookkeeping takes the shared
// memory the wider tiles would need).
inline constexpr int kBwdNeighborhoodMaxHeadDim = 128;

// Head-dim buckets with a fused kernel (the dK/dV kernel adding dQ as well: fused_dq.cuh, whose
// two warpgroups split the dQ product by keys at D 64 and by head-dim columns at D 128 and 256;
// at D 256 it is the dK part's kernel, beside the dV part's of the split form).
constexpr bool bwd_fused_bucket(int head_dim_bucket) {
  return head_dim_bucket == 64 || head_dim_bucket == 128 || head_dim_bucket == 256;
}

// Both kernels: two warpgroups (256 threads), each owning 64 rows of the block's own side.
inline constexpr int kBwdThreads = 256;

// dK/dV kernel: 128 keys per block (64 per warpgroup: the A operand of S^T = K Q^T and
// dP^T = V dO^T), walking query tiles (the N of those products and the K of dV += P^T dO,
// dK += dS^T Q): 64 queries, 96 up to D = 64, where dK and dV leave registers for wider score
// tiles (fewer barriers and statistics loads per product).
inline constexpr int kBwdKeysPerBlock = 128;
// Above D = 128 the tiles shrink to 32 queries so that K, V and three Q/dO stages fit in 227 KB.
// Token tiles (neighborhood attention) gather query boxes of a power-of-two size: 64.
constexpr int bwd_queries_per_tile(int head_dim_bucket, bool token_tiles = false) {
  return head_dim_bucket <= 64 && !token_tiles ? 96 : (head_dim_bucket <= 128 ? 64 : 32);
}

// dQ kernel: 128 queries per block (64 per warpgroup), walking key tiles: S and dP cost N / 2
// floats a thread each next to the D / 2 of dQ. How wide a key tile is depends on the head dim
// and on what the block's policy adds to the scores (DqScores).
inline constexpr int kBwdQueriesPerBlock = 128;
// What a dQ block's policy adds to its scores: a range mask only (plain, window), a modifier of
// its own (bias, rel-pos, neighborhood), or the general policy's (softcap, staged bias, dbias).
enum class DqScores { kMaskOnly, kModifier, kGeneral };
// Up to D = 64: 128 keys, 64 under the general policy (softcap's and the bias tile's code spilled
// 208 bytes there at 128). Up to D = 128: 64. Above: 48 for a range mask only (two stages from
// D = 224 on: bwd_dq_stages), else 32. At 48 keys S and dP read their operands from shared memory
// for a fifth fewer bytes a FLOP than at 32, which the SM's 128 bytes a clock bound there (H200,
// 2026-11-29, the dQ kernel alone: D 256 L 4096 1.744 -> 1.550 ms, causal L 8192 1.700 -> 1.460,
// L 16384 6.75 -> 6.05; the same bits).
constexpr int bwd_keys_per_tile(int head_dim_bucket, DqScores scores = DqScores::kModifier) {
  if (head_dim_bucket <= 64) return scores == DqScores::kGeneral ? 64 : 128;
  if (head_dim_bucket <= 128) return 64;
  return scores == DqScores::kMaskOnly ? 48 : 32;
}

inline constexpr int kBwdStages = 3;
// Stages of a dQ kernel's K / V tiles: three where they fit beside Q and dO in 227 KB, else two
// (48-key tiles from D = 224 on).
constexpr int bwd_dq_stages(int head_dim_bucket, DqScores scores = DqScores::kModifier) {
  const int fixed = 2 * kBwdQueriesPerBlock * head_dim_bucket * 2 + 1024;
  const int stage = 2 * bwd_keys_per_tile(head_dim_bucket, scores) * head_dim_bucket * 2;
  return fixed + kBwdStages * stage <= 227 * 1024 ? kBwdStages : 2;
}
// Stages of a dK/dV kernel: three, but two in the fused dK kernel of D 256, whose dS^T tile (8 KB)
// does not fit beside K, V and three Q/dO stages (226 of the 227 KB).
constexpr int bwd_dkdv_stages(int head_dim_bucket, bool fused) {
  return fused && head_dim_bucket > 128 ? 2 : kBwdStages;
}

// The warp-specialized fused backward (mainloop_bwd_fused.cuh): a block owns 128 keys (64 per math
// warpgroup, the M of S^T = K Q^T and dP^T = V dO^T) and walks query tiles of 64 queries at D 128
// and 128 at D 64, the largest N for which S^T, dP^T, dK and dV of a warpgroup stay in its 240
// registers (D 128: dK + dV 128 floats a thread, S^T + dP^T 64; D 64: 64 and 128). Two stages of
// Q and dO, two dS^T tiles and the two warpgroups' dQ staging fill about 194 KB of shared memory
// at either bucket; a third stage would not fit.
inline constexpr int kBwdFusedKeysPerBlock = 128;
constexpr bool bwd_fused_ws_bucket(int head_dim_bucket) {
  return head_dim_bucket == 64 || head_dim_bucket == 128;
}
constexpr int bwd_fused_queries_per_tile(int head_dim_bucket) {
  return head_dim_bucket <= 64 ? 128 : 64;
}
// Whether the warp-specialized kernels (mainloop_bwd_fused.cuh, mainloop_bwd_fused_d256.cuh) take a
// problem's scale: they hide masked raw scores as -inf and fold the scale into the exponentials'
// FMA, which a scale <= 0 turns into +inf or NaN, unless softcap transforms the scores first.
inline bool ws_backward_takes_scale(const ForwardParams& f) {
  return f.softcap_log2 > 0.0f || f.scale_log2 > 0.0f;
}

// Threads: a producer warpgroup (warp 0 loads, warp 1 adds dQ to the accumulator) and two math
// warpgroups.
inline constexpr int kBwdFusedThreads = 384;

// Shared memory of a dQ block's 16-bit tiles: Q and dO, its K/V stages, and the slack that rounds
// the base up to the swizzle period.
constexpr int bwd_dq_tile_bytes(int head_dim_bucket, DqScores scores = DqScores::kModifier) {
  return 2 * kBwdQueriesPerBlock * head_dim_bucket * 2 +
         2 * bwd_dq_stages(head_dim_bucket, scores) * bwd_keys_per_tile(head_dim_bucket, scores) *
             head_dim_bucket * 2 +
         1024;
}

// Shared memory of a dK/dV block's 16-bit tiles: K and V, and per stage Q, dO and their rows'
// lse and Delta; plus the alignment slack.
constexpr int bwd_dkdv_tile_bytes(int head_dim_bucket, bool token_tiles = false,
                                  int stages = kBwdStages) {
  const int queries = bwd_queries_per_tile(head_dim_bucket, token_tiles);
  return 2 * kBwdKeysPerBlock * head_dim_bucket * 2 +
         stages * (2 * queries * head_dim_bucket * 2 + 2 * queries * 4) + 1024;
}

// A staged bias tile, one per stage after the tiles, 16-bit in 16-byte chunks swizzled by row:
// the dQ block's queries x one key tile (PolicyGeneral's tiles, or PolicyBias's), or one
// query tile x the dK/dV block's keys. The launches stage them when they fit (else the kernels
// read the bias from global memory).
constexpr int bwd_dq_bias_tile_bytes(int head_dim_bucket, DqScores scores = DqScores::kGeneral) {
  return kBwdQueriesPerBlock * bwd_keys_per_tile(head_dim_bucket, scores) * 2;
}
constexpr int bwd_dkdv_bias_tile_bytes(int head_dim_bucket) {
  return bwd_queries_per_tile(head_dim_bucket) * kBwdKeysPerBlock * 2;
}

// A dK/dV block's staged rel_w rows, one query tile per stage, after its tiles (PolicyRelPos).
inline std::int64_t bwd_rel_w_rows_bytes(const ForwardParams& f, int head_dim_bucket) {
  return std::int64_t{kBwdStages} * bwd_queries_per_tile(head_dim_bucket) *
         rel_w_rows_pitch(f.rel_w_size);
}

// A dQ block's rel-pos rows and drel_w table, after its tiles (PolicyRelPos).
inline std::int64_t bwd_rel_pos_smem_bytes(const ForwardParams& f) {
  const std::int64_t rel_h_size = (f.seqlen_k + f.rel_w_size - 1) / f.rel_w_size;
  return std::int64_t{kBwdQueriesPerBlock} * 4 *
         (rel_pos_tile_pitch(rel_h_size, f.rel_w_size) + rel_pos_grad_pitch(f.rel_w_size));
}

}  // namespace fmha::cuda::sm90
