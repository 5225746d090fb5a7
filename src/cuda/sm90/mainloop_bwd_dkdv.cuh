// The sm90 dK/dV kernel of the split backward (wgmma / cp.async; sm_90a only).
//
// Above D = 128 the work is split by output (tile_sizes_bwd.h DkDvPart): one kernel's blocks
// accumulate dV (S^T and dV below), the other's dK (S^T, dP^T and dK below).
//
// One block owns kBwdKeysPerBlock keys of one (batch, kv head), 64 per warpgroup, and walks every
// query head of the kv head's GQA group and, per head, the query tiles its mask policy lets see
// those keys (the sum over the group stays in the block's registers: K/V are never expanded).
// Per query tile (rows of every product are this warpgroup's keys):
//   S^T = K Q^T, dP^T = V dO^T          (wgmma, all operands K-major in shared memory)
//   P^T = exp2(scale * S^T - lse), dS^T = P^T (dP^T - Delta)   (column statistics in shared memory)
//     (the general policy: softcap's factor and the bias as in the dQ kernel, the bias tile read
//     transposed; dbias is the dQ kernel's)
//   dV += P^T dO, dK += dS^T Q          (wgmma, P^T / dS^T from registers, dO / Q MN-major)
// and writes dv and dk = scale * dK once. One rendezvous of all threads per tile, the Q/dO/
// statistics of a later tile loading behind it, and the two warpgroups in ping-pong where the
// policy allows (the loop's comment).
// Neighborhood attention (kTokenTiles) tiles the grid transposed (token_tiles.cuh): the block's
// keys are a key box, its query tiles the boxes of the queries that see them, all gathered by
// token.
// The fused backward (kFusedDq) also adds dQ = dS K of every tile to an fp32 accumulator
// (fused_dq.cuh), so that no dQ kernel recomputes S and dP; at D 256 the dK part's kernel does,
// with two Q/dO stages (bwd_dkdv_stages), beside the dV part's kernel of the split form.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/common/backward_params.h"
#include "cuda/common/backward_policies.cuh"
#include "cuda/common/block_coords.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm90/fused_dq.cuh"
#include "cuda/sm90/grid_dependency.cuh"
#include "cuda/sm90/tile_copies.cuh"
#include "cuda/sm90/tile_sizes_bwd.h"
#include "cuda/sm90/tiles.cuh"
#include "cuda/sm90/token_tiles.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace fmha::cuda::sm90 {

// Shared memory of the tiles; under rel-pos the staged rel_w rows follow (bwd_rel_w_rows_bytes),
// under the general policy the staged bias tiles (bwd_dkdv_bias_tile_bytes a stage), under token
// tiles their bookkeeping (DkDvTokenTiles).
template <int kD, bool kTokenTiles = false, int kStages = kBwdStages>
constexpr int bwd_dkdv_smem_bytes() {
  constexpr int kM = bwd_queries_per_tile(kD, kTokenTiles);
  constexpr int bytes = 2 * SwizzledTile<kBwdKeysPerBlock, kD>::kBytes +
                        kStages * (2 * SwizzledTile<kM, kD>::kBytes + 2 * kM * 4) + 1024;
  static_assert(bytes == bwd_dkdv_tile_bytes(kD, kTokenTiles, kStages), "as the dispatch counts");
  return bytes;
}

// The bias policy's staged tile of a stage: one query tile x the block's keys, in the layout of a
// K-major operand, which both its TMA copy and the threads' cp.async write.
template <int kD>
using DkDvBiasTile = SwizzledTile<bwd_queries_per_tile(kD), kBwdKeysPerBlock>;

// Token-tile bookkeeping of a dK/dV block: query boxes u .. u + stages live at once.
template <int kD>
using DkDvTokenTiles = KeyBoxSmem<bwd_queries_per_tile(kD, true), kBwdKeysPerBlock, kBwdStages + 1>;

// One block's work: dK and dV of its keys (kPart: both up to D = 128, one of them above); with
// kFusedDq also the block's share of dQ (fused_dq.cuh).
template <typename T, int kD, DkDvPart kPart, typename Policy, bool kFusedDq>
__device__ __forceinline__ void dkdv_block(const BackwardParams& p, const BackwardTileMaps& maps) {
  using Mask = typename Policy::Mask;
  constexpr bool kTokenTiles = Mask::kTokenTiles;
  constexpr int kN = kBwdKeysPerBlock;
  constexpr int kM = bwd_queries_per_tile(kD, kTokenTiles);
  constexpr int kStages = bwd_dkdv_stages(kD, kFusedDq);
  constexpr int kScoreTiles = kM / 8;
  constexpr int kOutTiles = kD / 8;
  constexpr bool kDv = kPart != DkDvPart::kDk;  // this block accumulates dV
  constexpr bool kDk = kPart != DkDvPart::kDv;  // and dK (S^T's partner dP^T only for dK)
  using KTile = SwizzledTile<kN, kD>;
  using QTile = SwizzledTile<kM, kD>;
  using TokenTiles = DkDvTokenTiles<kD>;
  using Scores = typename Policy::template Scores<T>;
  using Convert = tile::Dtype<T>;
  using Fused = FusedDq<kFusedDq ? kD : 64, kN, kM>;
  static_assert(!kFusedDq || (!kTokenTiles && kPart == (kD > 128 ? DkDvPart::kDk : DkDvPart::kBoth)),
                "fused: range masks; at D 256 the dK part's kernel");
  static_assert(kPart == DkDvPart::kBoth || (!kTokenTiles && kD > 128), "as bwd_num_parts");
  constexpr bool kModifiers = std::is_same_v<Policy, PolicyGeneral>;  // softcap, bias
  // A bias alone (score_bias.cuh): natural-unit scores, its tiles staged as the general policy's.
  constexpr bool kBias = std::is_same_v<Policy, PolicyBias>;
  // Ping-pong (the loop's comment) for the plain policy up to D 64, where it was measured to gain
  // (H200, 2026-11-26: SAM-B 2.02-2.03 -> 1.93-1.95 ms). Slower under causal masks (D 64 L 512
  // 0.350 -> 0.371 ms), the bias (SAM-B 2.43 -> 2.60) and at D 128 (L 8192 4.55 -> 4.78); the
  // fused kernel meets at barriers of its own inside a step.
  constexpr bool kPingPong = !kFusedDq && std::is_same_v<Policy, PolicyPlain> && kD <= 64;
  // Steps loading ahead of the current one. Under ping-pong the follower reads step u's stage
  // after rendezvous u + 1, so the loads issued there go one step ahead only.
  constexpr int kAhead = kPingPong ? 1 : kStages - 1;
  const ForwardParams& f = p.fwd;

  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  const std::uint32_t smem_k = (tile::shared_address(smem_raw) + 1023u) & ~1023u;
  std::uint8_t* const smem_k_ptr = smem_raw + (smem_k - tile::shared_address(smem_raw));
  const std::uint32_t smem_v = smem_k + KTile::kBytes;
  auto smem_q = [&](int stage) { return smem_v + KTile::kBytes + stage * QTile::kBytes; };
  auto smem_do = [&](int stage) {
    return smem_v + KTile::kBytes + (kStages + stage) * QTile::kBytes;
  };
  // Fused: the dQ sum tile between the dO stages and the statistics, and the tail (below) 1024-byte
  // aligned for the dS^T tile.
  const std::uint32_t smem_sum = smem_v + KTile::kBytes + 2 * kStages * QTile::kBytes;
  const std::uint32_t smem_stats = smem_sum + (kFusedDq ? Fused::kSumBytes : 0);
  const std::uint32_t smem_after_stats = smem_stats + 2 * kStages * kM * 4;
  const std::uint32_t smem_tail =
      kFusedDq || kBias ? (smem_after_stats + 1023u) & ~1023u : smem_after_stats;
  auto smem_lse = [&](int stage) { return smem_stats + stage * kM * 4; };
  auto smem_delta = [&](int stage) { return smem_stats + (kStages + stage) * kM * 4; };
  const float* const stats_ptr = reinterpret_cast<const float*>(smem_k_ptr + (smem_stats - smem_k));
  // Rel-pos: rel_w rows of each stage's query tile.
  [[maybe_unused]] const int rel_pitch = static_cast<int>(rel_w_rows_pitch(f.rel_w_size));
  [[maybe_unused]] const std::uint32_t smem_rel = smem_after_stats;
  [[maybe_unused]] const bool rel_h_staged = rel_h_staged_in_pairs(f, kN);
  // General and bias policies: the bias tile of each stage's query tile, in the same place (the
  // bias policy's a DkDvBiasTile, from a 1024-byte boundary: its TMA copy writes the swizzle).
  [[maybe_unused]] auto smem_bias = [&](int stage) {
    return smem_tail + stage * bwd_dkdv_bias_tile_bytes(kD);
  };
  static_assert(!kBias || DkDvBiasTile<kD>::kBytes == bwd_dkdv_bias_tile_bytes(kD),
                "as the launch counts");
  // The bias policy: thread 0 copies each step's bias tile by TMA where the launch made its map
  // (maps.bias_usable), right after the rendezvous that frees its stage, and the threads wait on
  // the stage's full barrier before reading it; else every thread copies it with cp.async.
  [[maybe_unused]] const bool bias_by_tma = kBias && maps.bias_usable;
  [[maybe_unused]] std::uint64_t* full = nullptr;
  if constexpr (kBias) {
    if (bias_by_tma) full = init_stage_barriers<kStages>();
  }
  // Fused: the step's dS^T tile is the bias tile of its own stage where the bias is staged (the
  // scores have read it by then, and the stage's next copies come after the step), else a tile of
  // its own at the tail. Staged bias tiles and dS^T's own tile would not fit together at D 64.
  [[maybe_unused]] const bool ds_in_bias = ds_in_bias_tile<Policy>(f.bias_staged);
  static_assert(!kFusedDq || bwd_dkdv_bias_tile_bytes(kD) == Fused::DsTile::kBytes,
                "dS^T fits a bias tile exactly");

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const BlockCoords coords = block_coords<kModifiers || kBias>(f);
  const std::int64_t b = coords.batch, key_tile = coords.tile;
  const int hk = coords.head;
  // Token tiles: the block's keys are tokens of its grid box, so the pointers start at token 0.
  const std::int64_t n0 = kTokenTiles ? 0 : key_tile * kN;

  const SequenceRows rows_of_batch = sequence_rows(f, b);
  const std::int64_t q_start = rows_of_batch.q_start, k_start = rows_of_batch.k_start;
  const std::int64_t num_queries = rows_of_batch.num_queries, num_keys = rows_of_batch.num_keys;
  if (n0 >= num_keys) return;  // varlen: this sequence has fewer keys than the longest
  const int valid_keys =
      kTokenTiles ? kN : static_cast<int>(num_keys - n0 < kN ? num_keys - n0 : kN);

  const auto* k_tile = static_cast<const std::uint16_t*>(f.k) + b * f.k_batch_stride +
                       (k_start + n0) * f.k_row_stride + hk * f.k_head_stride;
  const auto* v_tile = static_cast<const std::uint16_t*>(f.v) + b * f.v_batch_stride +
                       (k_start + n0) * f.v_row_stride + hk * f.v_head_stride;

  const Mask mask = Mask::make(f, num_queries, num_keys);
  const Scores scores = Scores::make(f, b, hk * f.kv_group, num_queries, num_keys);
  // The plain scale rides on the exponentials' FMA where it may (scale_foldable); a bias alone
  // hands its scores in natural units.
  const bool scale_folded = scale_foldable(scores);
  const float exp_scale = exponent_scale(scores);
  auto* const tt =
      reinterpret_cast<TokenTiles*>(smem_k_ptr + (smem_stats - smem_k) + 2 * kStages * kM * 4);
  TileSpan query_tiles{0, 0};  // range masks: the query tiles that see the block's keys
  int m_tiles = 0;  // 32-bit, as the step count: the loop divides by it on every step
  if constexpr (kTokenTiles) {
    // The block's key box, its keys' tokens and transposed windows; query boxes 0 .. stages - 1
    // below, once the step count is known.
    init_key_box<kM, kN, kBwdThreads>(tt, *mask.grid, static_cast<int>(key_tile));
    m_tiles = static_cast<int>(tt->tiles.num_seen_tiles);
  } else {
    const QueryRange rows_range = query_range(mask, n0, n0 + valid_keys - 1, num_queries);
    query_tiles = tiles_over(rows_range.begin, rows_range.end, kM);
    m_tiles = static_cast<int>(query_tiles.count);
  }
  const int num_steps = m_tiles * f.kv_group;
  if constexpr (kTokenTiles) {
    for (int u = 0; u < kStages && u < num_steps; ++u) {
      stage_query_box<kM, kN, kBwdThreads>(tt, *mask.grid, u, u % m_tiles);
    }
    __syncthreads();
  }

  // Plain, window and bias policies up to D 64: a step's Q and dO tiles copy through per-thread
  // loaders set up once (tiles.cuh; the general copies' 64-bit row arithmetic is a large part of a
  // step's instructions, about a third of the SAM-B rel-pos kernel's). Elsewhere they took
  // registers the kernel does not have (sm_90a, bf16: D 64 rel-pos 24 bytes of spill, general 32;
  // D 128 window 16; H100, 2026-11-23).
  using StepLoader = RangeTileLoader<kM, kD, kBwdThreads>;
  constexpr bool kStepLoads = !kTokenTiles && !kModifiers &&
                              !std::is_same_v<Policy, PolicyRelPos> && kD <= 64 &&
                              StepLoader::kUsable;
  const bool step_loads = kStepLoads && f.vector_loads;
  const std::int64_t first_head = hk * f.kv_group;
  const StepLoader q_loader(static_cast<const std::uint16_t*>(f.q) + b * f.q_batch_stride +
                                q_start * f.q_row_stride + first_head * f.q_head_stride,
                            f.q_row_stride, f.head_dim);
  const StepLoader do_loader(static_cast<const std::uint16_t*>(p.dout) + b * p.dout_batch_stride +
                                 q_start * p.dout_row_stride + first_head * p.dout_head_stride,
                             p.dout_row_stride, f.value_dim);

  // Step u: query head hk * group + u / m_tiles, query tile u % m_tiles of query_tiles.
  auto step_head = [&](int u) { return hk * f.kv_group + u / m_tiles; };
  auto step_m0 = [&](int u) {
    return query_tiles.first_row + static_cast<std::int64_t>(u % m_tiles) * kM;
  };
  auto load_step = [&](int u, int stage) {
    const int h = step_head(u);
    if constexpr (kTokenTiles) {  // query box u % m_tiles, gathered by token (from token 0)
      const int* tokens = tt->query_token[u % TokenTiles::kSlots];
      const auto* q =
          static_cast<const std::uint16_t*>(f.q) + b * f.q_batch_stride + h * f.q_head_stride;
      const auto* dout = static_cast<const std::uint16_t*>(p.dout) + b * p.dout_batch_stride +
                         h * p.dout_head_stride;
      load_rows_async<kM, kD, kBwdThreads>(smem_q(stage), q, f.q_row_stride, tokens, f.head_dim,
                                           f.vector_loads);
      load_rows_async<kM, kD, kBwdThreads>(smem_do(stage), dout, p.dout_row_stride, tokens,
                                           f.value_dim, f.vector_loads);
      const std::int64_t stat = b * p.stat_batch_stride + h * p.stat_head_stride;
      // Rows without a token: lse +inf (P = 0).
      load_floats_by_token_async(smem_lse(stage), p.lse_log2 + stat, tokens, kM, INFINITY, 0);
      load_floats_by_token_async(smem_delta(stage), p.delta + stat, tokens, kM, 0.0f, kM);
      return;
    }
    const std::int64_t m0 = step_m0(u);
    const int rows = static_cast<int>(num_queries - m0 < kM ? num_queries - m0 : kM);
    bool loaded = false;
    if constexpr (kStepLoads) {
      if (step_loads) {
        const std::int64_t head = h - first_head;
        q_loader.load_at(smem_q(stage), head * f.q_head_stride + m0 * f.q_row_stride, rows);
        do_loader.load_at(smem_do(stage), head * p.dout_head_stride + m0 * p.dout_row_stride, rows);
        loaded = true;
      }
    }
    if (!loaded) {
      const auto* q = static_cast<const std::uint16_t*>(f.q) + b * f.q_batch_stride +
                      (q_start + m0) * f.q_row_stride + h * f.q_head_stride;
      const auto* dout = static_cast<const std::uint16_t*>(p.dout) + b * p.dout_batch_stride +
                         (q_start + m0) * p.dout_row_stride + h * p.dout_head_stride;
      load_tile_async<kM, kD, kBwdThreads>(smem_q(stage), q, f.q_row_stride, rows, f.head_dim,
                                           f.vector_loads);
      load_tile_async<kM, kD, kBwdThreads>(smem_do(stage), dout, p.dout_row_stride, rows,
                                           f.value_dim, f.vector_loads);
    }
    const std::int64_t stat = b * p.stat_batch_stride + h * p.stat_head_stride + q_start + m0;
    load_floats_async(smem_lse(stage), p.lse_log2 + stat, kM, rows, 0);
    if constexpr (kDk) load_floats_async(smem_delta(stage), p.delta + stat, kM, rows, kM);
    if constexpr (std::is_same_v<Policy, PolicyRelPos>) {
      scores.template load_rel_w_async<kM, kN, kBwdThreads>(smem_rel + stage * kM * rel_pitch,
                                                            rel_pitch, b, h, m0, rel_h_staged, n0);
    }
    if constexpr (kBias) {  // always staged (the launch's condition)
      if (!bias_by_tma) {
        const Scores head_bias = Scores::make(f, b, h, num_queries, num_keys);
        const std::int64_t left = num_keys - n0;
        load_tile_async<kM, kN, kBwdThreads>(smem_bias(stage), head_bias.tile_source(m0, n0),
                                             f.bias_stride[2], rows,
                                             left < kN ? static_cast<int>(left) : kN, true);
      } else if (threadIdx.x == 0) {
        barrier_arrive_expect_bytes(&full[stage], DkDvBiasTile<kD>::kBytes);
        tma_load_bias_tile<DkDvBiasTile<kD>>(smem_k_ptr + (smem_bias(stage) - smem_k), maps.bias, f,
                                             m0, h, b, n0, &full[stage]);
      }
    }
    if constexpr (kModifiers) {
      if (f.bias_staged) {  // the step's head's bias: query rows m0.., the block's keys
        Scores::make(f, b, h, num_queries, num_keys)
            .template load_bias_tile_async<kM, kN, kBwdThreads>(smem_bias(stage), m0, n0);
      }
    }
  };

  if constexpr (kTokenTiles) {
    load_rows_async<kN, kD, kBwdThreads>(smem_k, k_tile, f.k_row_stride, tt->key_token, f.head_dim,
                                         f.vector_loads);
    load_rows_async<kN, kD, kBwdThreads>(smem_v, v_tile, f.v_row_stride, tt->key_token, f.value_dim,
                                         f.vector_loads);
  } else {
    load_tile_async<kN, kD, kBwdThreads>(smem_k, k_tile, f.k_row_stride, valid_keys, f.head_dim,
                                         f.vector_loads);
    if constexpr (kDk) {  // V only for dP^T
      load_tile_async<kN, kD, kBwdThreads>(smem_v, v_tile, f.v_row_stride, valid_keys,
                                           f.value_dim, f.vector_loads);
    }
  }
#pragma unroll
  for (int u = 0; u < kAhead; ++u) {
    if (u < num_steps) load_step(u, u);
    tile::cp_async_commit();
  }

  // This thread's keys (rows of S^T): key_row and key_row + 8; its query columns 2c, 2c + 1 of
  // every 8-column tile.
  const std::int64_t key_row = n0 + warp * 16 + lane / 4;
  const int fragment_col = 2 * (lane % 4);
  const int first_key_row = warpgroup * 64;
  const std::int64_t warpgroup_first_key = n0 + first_key_row;

  float dk[kOutTiles][4], dv[kOutTiles][4];
  float s[kScoreTiles][4], dp[kScoreTiles][4];
#pragma unroll
  for (int t = 0; t < kOutTiles; ++t) {
    dk[t][0] = dk[t][1] = dk[t][2] = dk[t][3] = 0.0f;
    dv[t][0] = dv[t][1] = dv[t][2] = dv[t][3] = 0.0f;
  }
#pragma unroll
  for (int t = 0; t < kScoreTiles; ++t) {
    s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
    dp[t][0] = dp[t][1] = dp[t][2] = dp[t][3] = 0.0f;
  }

  // Rendezvous u of all threads: step u's tiles have landed for everyone (each thread waits for
  // its own copies and fences them for the async proxy first), and every warp is done with the
  // stage that step u + kAhead overwrites, whose loads it then issues.
  auto rendezvous = [&](int u) {
    rendezvous_then_load<kAhead - 1, kBwdThreads>([&] {
      if (u + kAhead < num_steps) load_step(u + kAhead, (u + kAhead) % kStages);
    });
    if constexpr (kTokenTiles) {
      // Query box of step u + stages into the slot of step u - 1, whose last reader (the scores
      // of step u - 1) is done; its loads are issued after the next barrier.
      if (u + kStages < num_steps) {
        stage_query_box<kM, kN, kBwdThreads>(tt, *mask.grid, u + kStages,
                                             (u + kStages) % m_tiles);
      }
    }
  };

  // Ping-pong: warpgroup 0, the leader, and warpgroup 1, the follower, meet at rendezvous u at
  // different points of their own work, as in the dQ kernel (mainloop_bwd_dq.cuh):
  //   leader:    R(u)  S^T, dP^T(u)  arrive(turn)  wait                  softmax u  dV, dK(u) | ..
  //   follower:                      sync(turn)    S^T, dP^T(u)  wait  R(u + 1)  softmax u  ..
  // The follower's softmax (its statistics and bias tile) and products of step u read step u's
  // stage after R(u + 1), whose loads (kAhead 1) go to the stage of step u + 2. Without ping-pong
  // both warpgroups run the leader's line without the turn barrier.
  const PingPongTurns<kPingPong, kBwdThreads> turns{kPingPong && warpgroup == 1};
  turns.start(rendezvous, num_steps);
  for (int u = 0; u < num_steps; ++u) {
    const int stage = u % kStages;
    const std::int64_t m0 = step_m0(u);
    turns.before_products(rendezvous, u);

    // S^T and dP^T as one straight run of wgmma over every k-step of the bucket: a branch
    // inside the run (to skip a last step of zero columns, D 80 in 96) makes ptxas end the group
    // and inject warpgroup.arrive (warning C7519), and two runs chosen before the fence cost
    // this kernel 20-36 bytes of spill at D 128; the columns past the head dim are zeros.
    wgmma_fence();
    ss_product<T, kD / 16, KTile, QTile>(s, smem_k, first_key_row, smem_q(stage));
    if constexpr (kDk) {
      ss_product<T, kD / 16, KTile, QTile>(dp, smem_v, first_key_row, smem_do(stage));
    }
    wgmma_commit();
    turns.after_issue();
    wgmma_wait<0>();
    fence_accumulators(s);
    fence_accumulators(dp);
    turns.after_wait(rendezvous, u, num_steps);

    if constexpr (kBias) {
      if (bias_by_tma) barrier_wait(&full[stage], (u / kStages) & 1);
      const std::uint32_t tile = smem_bias(stage);
      scores.scale_and_add_tile_transposed(
          s, [tile](int r, int c) { return tile + DkDvBiasTile<kD>::chunk_offset(r, c); },
          warp * 16, lane);
    } else if (!scale_folded) {
      scores.transform(s);
    }
    const float* lse = stats_ptr + stage * kM;
    const float* delta = stats_ptr + (kStages + stage) * kM;
    bool softcap_folded = false;  // dP^T - Delta already holds softcap's factor
    if constexpr (kModifiers) {
      if (kDk && scores.softcap_log2 > 0.0f) {
        fold_softcap_grad(scores, s, dp,
                          [&](int t, int e) { return delta[t * 8 + fragment_col + (e & 1)]; });
        softcap_folded = true;
      }
      if (f.bias_staged) {
        scores.template add_bias_tile_transposed<kN>(s, smem_bias(stage), warp * 16, lane);
      } else {
        Scores::make(f, b, step_head(u), num_queries, num_keys)
            .add_bias_transposed(s, key_row, m0 + fragment_col);
      }
    }
    if constexpr (std::is_same_v<Policy, PolicyRelPos>) {
      scores.add_transposed(s, b, step_head(u), key_row, m0 + fragment_col, fragment_col,
                            smem_k_ptr + (smem_rel - smem_k) + stage * kM * rel_pitch, rel_pitch,
                            num_keys, rel_h_staged, n0, smem_rel + stage * kM * rel_pitch, lane);
    }
    if constexpr (kTokenTiles) {
      hide_unseen_transposed(tt, u % TokenTiles::kSlots, s, warp * 16 + lane / 4,
                             fragment_col);
    } else {
      const bool full =
          m0 + kM <= num_queries && mask.tile_is_full(m0, m0 + kM - 1, warpgroup_first_key, 64);
      if (!full) hide_invisible_transposed(mask, s, key_row, m0 + fragment_col, num_queries);
    }
#pragma unroll
    for (int t = 0; t < kScoreTiles; ++t) {
      const float2 l = *reinterpret_cast<const float2*>(lse + t * 8 + fragment_col);
      const float2 d = softcap_folded || !kDk
                           ? make_float2(0.0f, 0.0f)
                           : *reinterpret_cast<const float2*>(delta + t * 8 + fragment_col);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float prob = exp2_ftz(fmaf(s[t][e], exp_scale, -((e & 1) ? l.y : l.x)));
        if constexpr (kDk) dp[t][e] = prob * (dp[t][e] - ((e & 1) ? d.y : d.x));  // dS^T
        s[t][e] = prob;                                                           // P^T
      }
    }

    std::uint32_t pa[kM / 16][4], da[kM / 16][4];
    if constexpr (kDv) pack_fragments<T>(s, pa);
    if constexpr (kDk) pack_fragments<T>(dp, da);
    [[maybe_unused]] const std::uint32_t smem_ds = ds_in_bias ? smem_bias(stage) : smem_tail;
    if constexpr (kFusedDq) {
      if (ds_in_bias) __syncthreads();  // every warp has read the stage's bias tile
      Fused::store_ds(smem_ds, warp * 16, da, lane);
    }
    fence_accumulators(dv);
    fence_accumulators(dk);
    wgmma_fence();
    if constexpr (kDv) rs_product<T, kM / 16, QTile>(dv, pa, smem_do(stage));
    if constexpr (kDk) rs_product<T, kM / 16, QTile>(dk, da, smem_q(stage));
    wgmma_commit();
    if constexpr (kFusedDq) {
      // dQ^T = K^T dS^T while dV and dK run, then added to the accumulator.
      typename Fused::Accum dq;
      Fused::publish_ds(warpgroup);
      Fused::template product<T, KTile>(dq, smem_k, smem_ds, warpgroup);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int c = 0; c < Fused::kColBlocks; ++c) fence_accumulators(dq[c]);
      const int h = step_head(u);
      const std::int64_t first_query = q_start + m0;
      float* const accum =
          p.dq_accum + b * p.accum_batch_stride + h * p.accum_head_stride + first_query;
      const int valid_queries = static_cast<int>(num_queries - m0 < kM ? num_queries - m0 : kM);
      // dQ^T into the sum tile (D 64: the warpgroups' partial sums meet there), whose rows the
      // copy engine adds to the accumulator while the block goes on; at D 256 straight from the
      // registers.
      Fused::wait_sum_read(warpgroup);  // the last step's bulk reductions
      if constexpr (!Fused::kStagedSums) {
        Fused::add_registers(dq, accum, p.accum_col_stride, warpgroup, warp, lane, f.head_dim,
                             valid_queries, (reinterpret_cast<std::uintptr_t>(accum) & 7) == 0);
      } else if constexpr (Fused::kSplitKeys) {
        __syncthreads();
        if (warpgroup == 0) Fused::stage(dq, smem_sum, warpgroup, warp, lane, false);
        __syncthreads();
        if (warpgroup == 1) Fused::stage(dq, smem_sum, warpgroup, warp, lane, true);
        fence_proxy_async();
        __syncthreads();
      } else {
        Fused::warpgroup_barrier(warpgroup);
        Fused::stage(dq, smem_sum, warpgroup, warp, lane, false);
        fence_proxy_async();
        Fused::warpgroup_barrier(warpgroup);
      }
      if constexpr (Fused::kStagedSums) {
        Fused::add_sum(reinterpret_cast<const float*>(smem_k_ptr + (smem_sum - smem_k)), accum,
                       p.accum_col_stride, warpgroup, f.head_dim, valid_queries,
                       (first_query & 3) == 0);
      }
    } else {
      wgmma_wait<0>();
    }
    fence_accumulators(dv);
    fence_accumulators(dk);
  }

  // Epilogue: dk = scale * dK and dv staged in this warp's own rows of the K and V tiles (every
  // product reading them is done after the barrier), then stored 16 bytes at a time.
  if constexpr (kFusedDq) Fused::wait_sum_done(warpgroup);
  tile::cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kOutTiles; ++t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + lane / 4 + 8 * r;
      const std::uint32_t offset = KTile::chunk_offset(row, t) + fragment_col * 2;
      if constexpr (kDk) {
        const std::uint32_t k_packed =
            Convert::pack(dk[t][2 * r] * p.scale, dk[t][2 * r + 1] * p.scale);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_k + offset), "r"(k_packed) : "memory");
      }
      if constexpr (kDv) {
        const std::uint32_t v_packed = Convert::pack(dv[t][2 * r], dv[t][2 * r + 1]);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_v + offset), "r"(v_packed) : "memory");
      }
    }
  }
  __syncwarp();
  const int warp_keys = valid_keys - warp * 16;
  // Token tiles store by token from token 0.
  const std::int64_t key = k_start + n0 + (kTokenTiles ? 0 : warp * 16);
  const int* key_tokens = kTokenTiles ? tt->key_token + warp * 16 : nullptr;
  if constexpr (kDk) {
    store_tile_rows<kD, 0, kOutTiles>(smem_k_ptr, KTile{}, warp * 16, warp_keys,
                                      static_cast<std::uint16_t*>(p.dk) + b * p.dk_batch_stride +
                                          key * p.dk_row_stride + hk * p.dk_head_stride,
                                      p.dk_row_stride, f.head_dim, lane, key_tokens);
  }
  if constexpr (kDv) {
    store_tile_rows<kD, 0, kOutTiles>(smem_k_ptr + KTile::kBytes, KTile{}, warp * 16, warp_keys,
                                      static_cast<std::uint16_t*>(p.dv) + b * p.dv_batch_stride +
                                          key * p.dv_row_stride + hk * p.dv_head_stride,
                                      p.dv_row_stride, f.value_dim, lane, key_tokens);
  }
}

// kPart of dK/dV for every key tile (block_coords' tile). One kernel per part rather than a
// branch on the block index: with two bodies in one kernel the compiler hoists across them and
// spills (752 bytes at D = 256 for the column chunks this replaced, none with one body).
// kFusedDq: the fused backward's kernel (both outputs at D 64 / 128; dK at D 256).
// maps: the bias policy's tiles by TMA (bias_usable; nothing else is read through it).
template <typename T, int kD, typename Policy, DkDvPart kPart, bool kFusedDq = false>
__global__ void __launch_bounds__(kBwdThreads, 1)
    backward_dkdv_kernel(const __grid_constant__ BackwardParams p,
                         const __grid_constant__ BackwardTileMaps maps) {
  let_next_kernel_start();
  dkdv_block<T, kD, kPart, Policy, kFusedDq>(p, maps);
}

}  // namespace fmha::cuda::sm90
