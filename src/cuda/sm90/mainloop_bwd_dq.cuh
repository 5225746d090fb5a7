// The sm90 dQ kernel of the split backward (wgmma / cp.async; sm_90a only).
//
// One block owns kBwdQueriesPerBlock query rows of one (batch, head), 64 per warpgroup, and walks
// the key tiles its mask policy leaves visible, recomputing per tile:
//   S = Q K^T, dP = dO V^T            (wgmma, all operands K-major in shared memory)
//   P = exp2(scale * S - lse), dS = P (dP - Delta)   (row statistics in registers)
//     (the general policy: softcap's factor 1 - tanh^2 joins dP - Delta while S still holds the
//     capped scores, then the bias tile is added; dS goes to dbias here, the kernel that owns
//     each (query, key) element once per head)
//   dQ += dS K                        (wgmma, dS from registers, K MN-major)
// and writes dq = scale * dQ once. Pipeline as the forward's without a copy warpgroup: one
// rendezvous of all threads per tile, the loads of a later tile issued right after it, and the two
// warpgroups in ping-pong where the policy allows (the loop's comment).
// Neighborhood attention (kTokenTiles) tiles as the forward does (token_tiles.cuh): the block's
// rows are a query box, its key tiles the key boxes they see, all gathered by token.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/common/backward_params.h"
#include "cuda/common/backward_policies.cuh"
#include "cuda/common/block_coords.cuh"
#include "cuda/common/forward_policies.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm90/grid_dependency.cuh"
#include "cuda/sm90/policy_forms.h"
#include "cuda/sm90/tile_copies.cuh"
#include "cuda/sm90/tile_sizes_bwd.h"
#include "cuda/sm90/tiles.cuh"
#include "cuda/sm90/token_tiles.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace fmha::cuda::sm90 {

// What a policy adds to the scores, which sets the key tiles' width (bwd_keys_per_tile). Token
// tiles were once with the general policy, while their test ran per score (108 bytes of spill at
// 128 keys).
template <typename Policy>
inline constexpr DqScores kDqScores =
    kGeneralForm<Policy> ? DqScores::kGeneral
    : std::is_same_v<Policy, PolicyPlain> || std::is_same_v<Policy, PolicyWindow>
        ? DqScores::kMaskOnly
        : DqScores::kModifier;

// The bias policy's staged tile of a stage (kBiasTiles): the block's queries x one key tile, in the
// layout of a K-major operand, which both its TMA copy and the threads' cp.async write.
template <int kD>
using DqBiasTile = SwizzledTile<kBwdQueriesPerBlock, bwd_keys_per_tile(kD)>;

// Shared memory of the tiles; under rel-pos its rows and table follow (bwd_rel_pos_smem_bytes),
// under the general and bias policies the staged bias tiles (bwd_dq_bias_tile_bytes a stage),
// under token tiles their bookkeeping (TokenTileSmem).
template <int kD, typename Policy>
constexpr int bwd_dq_smem_bytes() {
  constexpr int kN = bwd_keys_per_tile(kD, kDqScores<Policy>);
  constexpr int bytes = 2 * SwizzledTile<kBwdQueriesPerBlock, kD>::kBytes +
                        2 * bwd_dq_stages(kD, kDqScores<Policy>) * SwizzledTile<kN, kD>::kBytes +
                        1024;
  static_assert(bytes == bwd_dq_tile_bytes(kD, kDqScores<Policy>), "as the dispatch counts");
  return bytes;
}

// Token-tile bookkeeping of a dQ block: the kernel's, and the type its launcher sizes shared memory
// and fills the column tables for (set_token_tiles).
template <int kD, typename Policy>
using DqTokenTiles =
    TokenTileSmem<kBwdQueriesPerBlock, bwd_keys_per_tile(kD, kDqScores<Policy>)>;

// kRelRows (PolicyRelPos only): 1 or 2 for the register form of rel-pos (score_rel_pos.cuh:
// rel_pos_registers_apply, a key tile is that many grid rows), the thread's rel_w entries in
// registers for the whole walk and rel_h folded into the exponent of each grid row's n8 tiles,
// fetched one tile ahead; 0 for the staged form (the block's rows in shared memory, any
// power-of-two width up to the tile).
// kBiasTiles (PolicyBias only): the bias read from tiles staged with each key tile's K and V
// (f.bias_staged; DqBiasTile) only, without the register form's code beside it (fetched one tile
// ahead, its registers live across the products): with both forms in one kernel the D 64 kernel
// spilled 132 bytes under ping-pong, which costs more than usual here, as local memory goes to L2
// once shared memory takes 225 KB of L1.
// maps.kv_usable (kBiasTiles only): thread 0 copies each key tile's K and V (and the bias tile,
// where maps.bias_usable) by TMA right after the rendezvous that frees its stage, instead of every
// thread issuing cp.async; the threads wait on the stage's full barrier before its first product.
// Measured on an H200 (2026-11-27, SAM-B with a [1, H, L, L] bias, against every thread's cp.async
// into the bias tiles' own layout): dQ kernel 1.705-1.725 -> 1.492-1.508 ms, the same bits. The
// plain policy's kernel (K and V only) went 1.277 -> 1.306-1.314 (D 64 causal L 512 0.223 ->
// 0.228), also with the follower's first thread copying and no block barrier after the set-up
// (1.307); so the other policies keep their cp.async loaders.
template <typename T, int kD, typename Policy, int kRelRows = 0, bool kBiasTiles = false>
__global__ void __launch_bounds__(kBwdThreads, 1)
    backward_dq_kernel(const __grid_constant__ BackwardParams p,
                       const __grid_constant__ BackwardTileMaps maps) {
  // Launched to overlap the dK/dV kernel (p.dq_overlaps_dkdv): complete only after it.
  const CompleteAfterPreviousKernel complete_after_dkdv;
  constexpr int kM = kBwdQueriesPerBlock;
  constexpr int kN = bwd_keys_per_tile(kD, kDqScores<Policy>);
  constexpr int kStages = bwd_dq_stages(kD, kDqScores<Policy>);
  constexpr int kScoreTiles = kN / 8;
  constexpr int kOutTiles = kD / 8;
  using QTile = SwizzledTile<kM, kD>;
  using KVTile = SwizzledTile<kN, kD>;
  using Mask = typename Policy::Mask;
  using Scores = typename Policy::template Scores<T>;
  using Convert = tile::Dtype<T>;
  constexpr bool kTokenTiles = Mask::kTokenTiles;
  using TokenTiles = DqTokenTiles<kD, Policy>;
  constexpr bool kRelRegisters = kRelRows > 0;
  static_assert(!kRelRegisters || kRelPosForm<Policy>, "a form of rel-pos");
  static_assert(!kBiasTiles || kBiasForm<Policy>, "a form of the bias policy");
  static_assert(kStages + 1 <= TokenTiles::kSlots, "key boxes u .. u + stages live at once");
  // Ping-pong (below) for the range tiles of the plain, window and bias policies up to D 128,
  // where it was measured; rel-pos, the general policy, token tiles and the tiles above D 128
  // keep both warpgroups in lockstep (at D 256 ping-pong over three stages of 32 keys was slower
  // than lockstep: H200, 2026-11-29, L 4096 1.744 -> 1.912 ms, causal L 8192 1.700 -> 1.816).
  constexpr bool kPingPong =
      !kTokenTiles && !kRelPosForm<Policy> && !kGeneralForm<Policy> && kD <= 128;
  // Key tiles loading ahead of the current one. Under ping-pong the follower reads tile u's stage
  // after rendezvous u + 1, so the loads issued there go one tile ahead only, to tile u + 2's
  // stage, which must not be u's.
  constexpr int kAhead = kPingPong ? 1 : kStages - 1;
  static_assert(!kPingPong || kStages >= 3, "the follower's stage stays until it is done");
  const ForwardParams& f = p.fwd;

  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  const std::uint32_t smem_q = (tile::shared_address(smem_raw) + 1023u) & ~1023u;
  std::uint8_t* const smem_q_ptr = smem_raw + (smem_q - tile::shared_address(smem_raw));
  const std::uint32_t smem_do = smem_q + QTile::kBytes;
  auto smem_k = [&](int stage) { return smem_do + QTile::kBytes + stage * KVTile::kBytes; };
  auto smem_v = [&](int stage) {
    return smem_do + QTile::kBytes + (kStages + stage) * KVTile::kBytes;
  };
  [[maybe_unused]] auto smem_bias = [&](int stage) {
    return smem_q + 2 * QTile::kBytes + 2 * kStages * KVTile::kBytes +
           stage * bwd_dq_bias_tile_bytes(kD, kDqScores<Policy>);
  };
  static_assert(!kBiasTiles ||
                    DqBiasTile<kD>::kBytes == bwd_dq_bias_tile_bytes(kD, DqScores::kModifier),
                "as the launch counts");
  // Whether thread 0 copies the key tiles by TMA (and the bias tiles: bias_by_tma).
  [[maybe_unused]] const bool tma = kBiasTiles && maps.kv_usable;
  [[maybe_unused]] const bool bias_by_tma = kBiasTiles && maps.bias_usable;
  [[maybe_unused]] std::uint64_t* full = nullptr;
  if constexpr (kBiasTiles) {
    if (tma) full = init_stage_barriers<kStages>();
  }

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const BlockCoords block = block_coords < kGeneralForm<Policy> || kBiasForm < Policy >> (f);
  const std::int64_t b = block.batch;
  const int h = block.head;
  const std::int64_t m_block = block.tiles - 1 - block.tile;

  const SequenceRows rows_of_batch = sequence_rows(f, b);
  const std::int64_t q_start = rows_of_batch.q_start, k_start = rows_of_batch.k_start;
  const std::int64_t num_queries = rows_of_batch.num_queries, num_keys = rows_of_batch.num_keys;
  // Token tiles: the block's rows are tokens of its grid box, so the pointers start at token 0.
  const std::int64_t m0 = kTokenTiles ? 0 : m_block * kM;
  if (m0 >= num_queries) return;
  const int rows =
      kTokenTiles ? kM : static_cast<int>(num_queries - m0 < kM ? num_queries - m0 : kM);
  const std::int64_t last_row = m0 + rows - 1;
  const int hk = h / f.kv_group;

  const auto* q = static_cast<const std::uint16_t*>(f.q) + b * f.q_batch_stride +
                  (q_start + m0) * f.q_row_stride + h * f.q_head_stride;
  const auto* dout = static_cast<const std::uint16_t*>(p.dout) + b * p.dout_batch_stride +
                     (q_start + m0) * p.dout_row_stride + h * p.dout_head_stride;
  const auto* k = static_cast<const std::uint16_t*>(f.k) + b * f.k_batch_stride +
                  k_start * f.k_row_stride + hk * f.k_head_stride;
  const auto* v = static_cast<const std::uint16_t*>(f.v) + b * f.v_batch_stride +
                  k_start * f.v_row_stride + hk * f.v_head_stride;

  const Mask mask = Mask::make(f, num_queries, num_keys);
  Scores scores = Scores::make(f, b, h, num_queries, num_keys);
  auto* const tt =
      reinterpret_cast<TokenTiles*>(smem_q_ptr + 2 * QTile::kBytes + 2 * kStages * KVTile::kBytes);
  TileSpan key_tiles{0, 0};  // range masks: the key tiles the block visits
  int num_tiles = 0;         // 32-bit: the loop's index arithmetic runs on every tile
  if constexpr (kTokenTiles) {
    // The block's query box, its rows' tokens and windows, key boxes 0 .. stages - 1.
    num_tiles = static_cast<int>(
        init_query_box<kM, kN, kBwdThreads>(tt, *mask.grid, static_cast<int>(m_block), kStages));
  } else {
    const KeyRange range = mask.key_range(m0, last_row);
    key_tiles = tiles_over(range.begin, range.end, kN);
    num_tiles = static_cast<int>(key_tiles.count);
  }
  // The bias policy's staged tile of the key tile from first_key, by every thread's cp.async, in
  // the layout its TMA copy writes (rows past the queries and keys past the sequence: zeros).
  // (`bias`: the scores' ScoreBias, a parameter so that other policies compile the lambda unused.)
  [[maybe_unused]] auto load_bias_tile = [&](const auto& bias, int stage, std::int64_t first_key) {
    const std::int64_t left = num_keys - first_key;
    load_tile_async<kM, kN, kBwdThreads>(smem_bias(stage), bias.tile_source(m0, first_key),
                                         f.bias_stride[2], rows,
                                         left < kN ? static_cast<int>(left) : kN, true);
  };
  // Range key tiles of 16-byte rows: per-thread loaders set up once (tiles.cuh).
  using RangeLoader = RangeTileLoader<kN, kD, kBwdThreads>;
  constexpr bool kRangeLoads = !kTokenTiles && RangeLoader::kUsable;
  const RangeLoader k_loader(k + key_tiles.first_row * f.k_row_stride, f.k_row_stride, f.head_dim);
  const RangeLoader v_loader(v + key_tiles.first_row * f.v_row_stride, f.v_row_stride, f.value_dim);
  auto load_keys = [&](int u, int stage) {
    if constexpr (kBiasTiles) {
      if (tma) {
        const std::int64_t first_key = key_tiles.first_row + static_cast<std::int64_t>(u) * kN;
        if (threadIdx.x == 0) {
          barrier_arrive_expect_bytes(
              &full[stage], 2 * KVTile::kBytes + (bias_by_tma ? DqBiasTile<kD>::kBytes : 0));
          tma_load_tile<KVTile>(smem_q_ptr + (smem_k(stage) - smem_q), maps.k, first_key, hk, b,
                                &full[stage]);
          tma_load_tile<KVTile>(smem_q_ptr + (smem_v(stage) - smem_q), maps.v, first_key, hk, b,
                                &full[stage]);
          if (bias_by_tma) {
            tma_load_bias_tile<DqBiasTile<kD>>(smem_q_ptr + (smem_bias(stage) - smem_q), maps.bias,
                                               f, m0, h, b, first_key, &full[stage]);
          }
        }
        if (!bias_by_tma) load_bias_tile(scores, stage, first_key);
        return;
      }
    }
    if constexpr (kTokenTiles) {  // key box u, gathered by token
      const int* tokens = tt->key_token[u % TokenTiles::kSlots];
      load_rows_async<kN, kD, kBwdThreads>(smem_k(stage), k, f.k_row_stride, tokens, f.head_dim,
                                           f.vector_loads);
      load_rows_async<kN, kD, kBwdThreads>(smem_v(stage), v, f.v_row_stride, tokens, f.value_dim,
                                           f.vector_loads);
      return;
    }
    const std::int64_t first_key = key_tiles.first_row + static_cast<std::int64_t>(u) * kN;
    const int valid = static_cast<int>(num_keys - first_key < kN ? num_keys - first_key : kN);
    bool loaded = false;
    if constexpr (kRangeLoads) {
      if (f.vector_loads) {
        k_loader.load(smem_k(stage), u, valid);
        v_loader.load(smem_v(stage), u, valid);
        loaded = true;
      }
    }
    if (!loaded) {
      load_tile_async<kN, kD, kBwdThreads>(smem_k(stage), k + first_key * f.k_row_stride,
                                           f.k_row_stride, valid, f.head_dim, f.vector_loads);
      load_tile_async<kN, kD, kBwdThreads>(smem_v(stage), v + first_key * f.v_row_stride,
                                           f.v_row_stride, valid, f.value_dim, f.vector_loads);
    }
    if constexpr (kBiasTiles) {
      load_bias_tile(scores, stage, first_key);
    } else if constexpr (kGeneralForm<Policy>) {
      if (f.bias_staged) {
        scores.template load_bias_tile_async<kM, kN, kBwdThreads>(smem_bias(stage), m0, first_key);
      }
    }
  };

  if constexpr (kTokenTiles) {
    load_rows_async<kM, kD, kBwdThreads>(smem_q, q, f.q_row_stride, tt->query[0].token, f.head_dim,
                                         f.vector_loads);
    load_rows_async<kM, kD, kBwdThreads>(smem_do, dout, p.dout_row_stride, tt->query[0].token,
                                         f.value_dim, f.vector_loads);
  } else {
    load_tile_async<kM, kD, kBwdThreads>(smem_q, q, f.q_row_stride, rows, f.head_dim,
                                         f.vector_loads);
    load_tile_async<kM, kD, kBwdThreads>(smem_do, dout, p.dout_row_stride, rows, f.value_dim,
                                         f.vector_loads);
  }
#pragma unroll
  for (int u = 0; u < kAhead; ++u) {
    if (u < num_tiles) load_keys(u, u);
    tile::cp_async_commit();
  }

  // This thread's two rows: their statistics live in registers for the whole walk.
  const std::int64_t fragment_row = m0 + warp * 16 + lane / 4;
  const int fragment_col = 2 * (lane % 4);

  // Rel-pos: the block's rows staged for the scores, and the gradients' destinations: this
  // thread's rows of drel_h itself (written in place, backward_params.h), its rows of the block's
  // drel_w table (zeroed here; the loop's first barrier publishes both; stored after the loop).
  using Storage = typename Convert::Storage;
  float* dw_table = nullptr;
  Storage *dh0 = nullptr, *dh8 = nullptr;
  float *dw0 = nullptr, *dw8 = nullptr;
  [[maybe_unused]] int dw_pitch = 0;
  if constexpr (kRelPosForm<Policy>) {
    auto* const rows_smem = reinterpret_cast<std::uint32_t*>(smem_q_ptr + 2 * QTile::kBytes +
                                                             2 * kStages * KVTile::kBytes);
    if constexpr (!kRelRegisters) scores.stage(rows_smem, m0, kM);
    dw_table = reinterpret_cast<float*>(rows_smem + kM * scores.pitch);
    dw_pitch = static_cast<int>(rel_pos_grad_pitch(f.rel_w_size));
    if (p.drel_w_out != nullptr) {
      for (int i = static_cast<int>(threadIdx.x); i < kM * dw_pitch; i += kBwdThreads) {
        dw_table[i] = 0.0f;
      }
      dw0 = dw_table + (warp * 16 + lane / 4) * dw_pitch;
      dw8 = dw0 + 8 * dw_pitch;
    }
    if (p.drel_h_out != nullptr) {
      Storage* const rows_of_head =
          static_cast<Storage*>(p.drel_h_out) + b * p.drel_h_stride[0] + h * p.drel_h_stride[1];
      if (fragment_row < num_queries) dh0 = rows_of_head + fragment_row * p.drel_h_stride[2];
      if (fragment_row + 8 < num_queries) {
        dh8 = rows_of_head + (fragment_row + 8) * p.drel_h_stride[2];
      }
    }
  }
  const int first_row = warpgroup * 64;
  float lse_log2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // Token tiles: the row's token (m0 is 0: fragment_row is the block-local row), -1 for none.
    const std::int64_t i =
        kTokenTiles ? tt->query[0].token[fragment_row + 8 * r] : fragment_row + 8 * r;
    const bool exists = i >= 0 && i < num_queries;
    const std::int64_t stat = b * p.stat_batch_stride + h * p.stat_head_stride + q_start + i;
    lse_log2[r] = exists ? p.lse_log2[stat] : INFINITY;  // past the end: P = 0
    delta[r] = exists ? p.delta[stat] : 0.0f;
  }

  float dq[kOutTiles][4];
  float s[kScoreTiles][4], dp[kScoreTiles][4];
#pragma unroll
  for (int t = 0; t < kOutTiles; ++t) dq[t][0] = dq[t][1] = dq[t][2] = dq[t][3] = 0.0f;
#pragma unroll
  for (int t = 0; t < kScoreTiles; ++t) {
    s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
    dp[t][0] = dp[t][1] = dp[t][2] = dp[t][3] = 0.0f;
  }

  // The plain scale rides on the exponentials' FMA where it may (scale_foldable); the register-form
  // bias hands its scores in natural units.
  const bool scale_folded = scale_foldable(scores);
  const float exp_scale = exponent_scale(scores);
  // Register-form rel-pos: this thread's rel_w entries for the whole walk, rel_h of tile u fetched
  // at tile u - 1 (tile 0's here; the keys start at 0: no mask).
  constexpr int kRuns = kRelRegisters ? kRelRows : 1;  // n8-tile runs with an exponent offset each
  [[maybe_unused]] float rel_w[kScoreTiles / kRuns][4];
  [[maybe_unused]] RelHRows rel_h_rows{};
  [[maybe_unused]] RelHFetch<kRuns> rel_h_next{};
  if constexpr (kRelRegisters) {
    scores.load_rel_w(rel_w, fragment_row, fragment_col);
    rel_h_rows = scores.rel_h_rows(fragment_row);
    rel_h_next = scores.template fetch_rel_h<kRuns>(rel_h_rows, 0);
  }
  // The bias policy: this thread's bias of key tile u from the tile's staged bias (kBiasTiles: the
  // tiles' rows are 16-byte chunks and they fit), else in the register form, fetched at tile u - 1
  // (tile 0's here).
  [[maybe_unused]] BiasFetch<kBiasForm<Policy> ? kScoreTiles : 1> bias_next{};
  [[maybe_unused]] BiasRows bias_rows{};
  if constexpr (kBiasForm<Policy>) {
    bias_rows = scores.rows(fragment_row);
    if (num_tiles > 0 && !kBiasTiles) {
      scores.fetch(bias_next, bias_rows, key_tiles.first_row + fragment_col);
    }
  }
  // Whether S and dP skip the bucket's last k-step, which would hold zero columns only for both.
  const bool short_dims = f.head_dim <= kD - 16 && f.value_dim <= kD - 16;

  // Rendezvous u of all threads: key tile u has landed for everyone (each thread waits for its own
  // copies and fences them for the async proxy first), and every warp is done with the stage that
  // tile u + kAhead overwrites, whose loads it then issues.
  auto rendezvous = [&](int u) {
    rendezvous_then_load<kAhead - 1, kBwdThreads>([&] {
      if (u + kAhead < num_tiles) load_keys(u + kAhead, (u + kAhead) % kStages);
    });
    if constexpr (kTokenTiles) {
      // Key box u + stages into the slot of box u + stages - kSlots, whose last reader (the
      // scores of its tile) is done; its loads are issued after the next barrier.
      if (u + kStages < num_tiles) {
        stage_key_box<kM, kN, kBwdThreads>(tt, tt->query[0], *mask.grid, u + kStages,
                                           (u + kStages) % TokenTiles::kSlots);
      }
    }
  };

  // Key tile u's softmax: S and dP in registers become dS (in s), the gradient wrt scale * q.k,
  // with the policy's gradients of its own (rel-pos, dbias) taken on the way.
  auto scores_to_ds = [&](int u) {
    const int stage = u % kStages;
    const std::int64_t first_key = key_tiles.first_row + static_cast<std::int64_t>(u) * kN;
    // Each row's exponent offset for each run of n8 tiles: -lse, plus rel_h in the register form.
    float shift[2][kRuns];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int g = 0; g < kRuns; ++g) shift[r][g] = -lse_log2[r];
    }
    if constexpr (kRelRegisters) {
      scores.scale_and_add_w(s, rel_w);
      float offset[2][kRuns];
      scores.rel_h_offsets(rel_h_next, offset);
      if (u + 1 < num_tiles) {
        rel_h_next = scores.template fetch_rel_h<kRuns>(rel_h_rows, first_key + kN);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int g = 0; g < kRuns; ++g) shift[r][g] += offset[r][g];
      }
    } else if constexpr (kRelPosForm<Policy>) {
      scores.scale_and_add(s, fragment_row, first_key, fragment_col);
    } else if constexpr (kBiasForm<Policy>) {
      if constexpr (kBiasTiles) {
        const std::uint32_t tile = smem_bias(stage);
        Scores::fetch_staged(
            bias_next, [tile](int r, int c) { return tile + DqBiasTile<kD>::chunk_offset(r, c); },
            warp * 16, lane);
      }
      scores.scale_and_add(s, bias_next);
      if (!kBiasTiles && u + 1 < num_tiles) {
        scores.fetch(bias_next, bias_rows, first_key + kN + fragment_col);
      }
    } else if (!scale_folded) {
      scores.transform(s);
    }
    float row_delta[2] = {delta[0], delta[1]};  // what dS subtracts from dP below
    if constexpr (kGeneralForm<Policy>) {
      if (scores.softcap_log2 > 0.0f) {
        fold_softcap_grad(scores, s, dp, [&](int, int e) { return row_delta[e / 2]; });
        row_delta[0] = row_delta[1] = 0.0f;
      }
      if (f.bias_staged) {
        scores.add_bias_tile(s, fragment_row, first_key + fragment_col,
                             smem_q_ptr + (smem_bias(stage) - smem_q), warp * 16 + lane / 4);
      } else {
        scores.add_bias(s, fragment_row, first_key + fragment_col);
      }
    }
    if constexpr (kTokenTiles) {
      gathered_scores(tt, tt->query[0], u % TokenTiles::kSlots, scores, s,
                      static_cast<int>(fragment_row), fragment_col);
    } else if (!mask.tile_is_full(m0, last_row, first_key, kN)) {
      hide_invisible(mask, s, fragment_row, first_key + fragment_col);
    }
#pragma unroll
    for (int t = 0; t < kScoreTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float prob =
            exp2_ftz(fmaf(s[t][e], exp_scale, shift[e / 2][t / (kScoreTiles / kRuns)]));
        s[t][e] = prob * (dp[t][e] - row_delta[e / 2]);  // dS, the gradient wrt scale * q.k
      }
    }
    if constexpr (kRelPosForm<Policy>) {
      if constexpr (kRelRegisters) {  // the width kN / kRelRows, a constant
        scores.template accumulate_grads_width<kN / kRelRows>(s, first_key, fragment_col, dh0, dh8,
                                                              p.drel_h_stride[3], dw0, dw8);
      } else {
        scores.accumulate_grads(s, first_key, fragment_col, dh0, dh8, p.drel_h_stride[3], dw0, dw8);
      }
    }
    if constexpr (kGeneralForm<Policy> || kBiasForm<Policy>) {
      // Without softcap (the dispatch's rule for dbias here) dS is also the score's gradient.
      if (p.dbias_accum != nullptr) {
        store_dbias_tiles(p, b, h, fragment_row, first_key + fragment_col, num_queries, num_keys,
                          s);
      }
    }
  };

  // S and dP of key tile u as one straight run of wgmma, its k-steps chosen before the fence (a
  // branch inside the run makes ptxas end the group and inject warpgroup.arrive, warning C7519);
  // the last k-step is skipped when it holds zero columns only for both products (D 80 in 96).
  auto issue_s_dp = [&](auto steps, int u) {
    constexpr int kSteps = decltype(steps)::value;
    if constexpr (kBiasTiles) {
      if (tma) barrier_wait(&full[u % kStages], (u / kStages) & 1);
    }
    wgmma_fence();
    ss_product<T, kSteps, QTile, KVTile>(s, smem_q, first_row, smem_k(u % kStages));
    ss_product<T, kSteps, QTile, KVTile>(dp, smem_do, first_row, smem_v(u % kStages));
    wgmma_commit();
  };
  // dQ += dS K of key tile u, dS packed from s.
  auto issue_dq = [&](int u) {
    std::uint32_t a[kN / 16][4];
    pack_fragments<T>(s, a);
    fence_fragments(a);
    fence_accumulators(dq);
    wgmma_fence();
    rs_product<T, kN / 16, KVTile>(dq, a, smem_k(u % kStages));
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(dq);
  };

  // Ping-pong: warpgroup 0, the leader, and warpgroup 1, the follower, meet at rendezvous u at
  // different points of their own work, as in the forward (forward_pipeline.cuh):
  //   leader:    R(u)  S, dP(u)  arrive(turn)  wait                softmax u  dQ(u) | R(u + 1) ..
  //   follower:                  sync(turn)    S, dP(u)  wait  R(u + 1)  softmax u  dQ(u) ..
  // so that each one's softmax runs under the other's products. Both run R(0) .. R(num_tiles - 1)
  // once each, in order (the follower R(0) before its loop), and the leader arrives at the turn
  // barrier as often as the follower waits there. The follower's softmax and dQ product of tile
  // u run after R(u + 1): the loads issued there (kAhead 1) go to the stage of tile u + 2, not
  // u's. Without ping-pong both warpgroups run the leader's line without the turn barrier.
  // Measured on an H200 (2026-11-26, SAM-B: B 8, H 12, L 4096, D 64, against the kernel without
  // ping-pong): dQ kernel 1.405 -> 1.305 ms, with a [1, H, L, L] bias 1.918 -> 1.714-1.724.
  // Issuing tile u - 1's dQ product with S and dP of tile u instead (one wgmma group a phase)
  // kept 32 more registers live across the products: 1.300 ms plain, but 212 bytes of spill
  // under the bias (3.27 ms: local memory goes to L2 once shared memory takes 225 KB of L1).
  const PingPongTurns<kPingPong, kBwdThreads> turns{kPingPong && warpgroup == 1};
  turns.start(rendezvous, num_tiles);
  for (int u = 0; u < num_tiles; ++u) {
    turns.before_products(rendezvous, u);
    if (short_dims) {
      issue_s_dp(std::integral_constant<int, kD / 16 - 1>{}, u);
    } else {
      issue_s_dp(std::integral_constant<int, kD / 16>{}, u);
    }
    turns.after_issue();
    wgmma_wait<0>();
    fence_accumulators(s);
    fence_accumulators(dp);
    turns.after_wait(rendezvous, u, num_tiles);
    scores_to_ds(u);
    issue_dq(u);
  }
  // Epilogue: dq = scale * dQ, staged in this warp's own rows of Q's tile (read only by this
  // warpgroup's finished products), then stored 16 bytes at a time.
  tile::cp_async_wait<0>();
  __syncthreads();
  if constexpr (kRelPosForm<Policy>) {
    if (p.drel_w_out != nullptr) {  // every slot of the table has its final sum
      const int width = static_cast<int>(f.rel_w_size);
      Storage* const rows_of_head =
          static_cast<Storage*>(p.drel_w_out) + b * p.drel_w_stride[0] + h * p.drel_w_stride[1];
      for (int i = static_cast<int>(threadIdx.x); i < rows * width; i += kBwdThreads) {
        const int r = i / width;
        const int c = i - r * width;
        rows_of_head[(m0 + r) * p.drel_w_stride[2] + c * p.drel_w_stride[3]] =
            Convert::from_float(dw_table[r * dw_pitch + c]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kOutTiles; ++t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + lane / 4 + 8 * r;
      const std::uint32_t packed =
          Convert::pack(dq[t][2 * r] * p.scale, dq[t][2 * r + 1] * p.scale);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_q + QTile::chunk_offset(row, t) +
                                                     fragment_col * 2),
                   "r"(packed)
                   : "memory");
    }
  }
  __syncwarp();
  // Token tiles store by token from token 0.
  store_tile_rows<kD>(
      smem_q_ptr, QTile{}, warp * 16, rows - warp * 16,
      static_cast<std::uint16_t*>(p.dq) + b * p.dq_batch_stride +
          (q_start + m0 + (kTokenTiles ? 0 : warp * 16)) * p.dq_row_stride + h * p.dq_head_stride,
      p.dq_row_stride, f.head_dim, lane, kTokenTiles ? tt->query[0].token + warp * 16 : nullptr);
}

}  // namespace fmha::cuda::sm90
