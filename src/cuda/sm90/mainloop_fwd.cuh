// The sm90 forward kernel (wgmma; TMA or cp.async copies; sm_90a only).
//
// A grid tile is fwd_block_m(D, policy) query rows of one (batch, head), computed by warpgroups of 64 rows
// each; a block computes one, or with a copy warpgroup a run of them (persistent blocks,
// forward_pipeline.cuh). For each it walks the key tiles that its mask policy leaves visible, then
// the extra-key tiles, with the same policies, online softmax and epilogue contract as the sm80
// kernel: scores come out of the wgmma accumulators in the m16n8 fragment layout that the policies
// already work on. Rows and key tiles are ranges of the sequence, or, for a mask with kTokenTiles
// (neighborhood attention), boxes of the token grid whose rows are gathered by token
// (neighborhood_mask.cuh; resolved at compile time, so the range policies keep their code); with a
// copy warpgroup the copy threads stage those boxes too (forward_pipeline.cuh).
//
// Phases. K and V sit in kv_stages(D) shared-memory stages (tile_sizes.h), tile j in stage
// j % stages. Each warpgroup runs phases u = 0 .. num_tiles (none when there is no key tile):
//   phase u    one wgmma group: O += P(u - 1) V(u - 1) (u > 0; A = P from registers, B = V
//              MN-major), then S(u) = Q K(u)^T (u < num_tiles; A = Q, B = K, both K-major)
//   wait       for the group
//   softmax u  scores, mask, online softmax on S(u) in registers (u < num_tiles)
// With kOverlapSoftmax the phase is two groups, S(u) first: the warpgroup waits for S(u) alone,
// runs the softmax of tile u while its P(u - 1) V(u - 1) is still on the tensor cores, and only
// then waits for that product and rescales O (tile_sizes.h: overlap_softmax; where ptxas keeps
// that wait after the softmax: pv_wait_after_softmax).
// Who copies the tiles into the stages, and how the two math warpgroups take turns on the tensor
// cores (ping-pong), is the block's schedule: forward_pipeline.cuh.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/block_coords.cuh"
#include "cuda/common/forward_params.h"
#include "cuda/common/forward_policies.cuh"
#include "cuda/common/neighborhood_mask.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm90/forward_epilogue.cuh"
#include "cuda/sm90/forward_pipeline.cuh"
#include "cuda/sm90/forward_smem.cuh"
#include "cuda/sm90/forward_softmax.cuh"
#include "cuda/sm90/tile_copies.cuh"
#include "cuda/sm90/tile_sizes.h"
#include "cuda/sm90/tiles.cuh"
#include "cuda/sm90/token_tiles.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/sm90/wgmma_ops.cuh"

namespace fmha::cuda::sm90 {

// The kinds of a forward phase (mainloop below): any (decided at run time), or, with the softmax
// overlapped, the first (S only), a middle one (S, then P V) and the last (P V only).
inline constexpr int kAnyPhase = 0, kFirstPhase = 1, kMiddlePhase = 2, kLastPhase = 3;

// Where the keys of tile u come from: the tiles of ordinary keys the mask leaves, then the
// tiles of extra keys.
struct KeySource {
  const std::uint16_t* k;
  const std::uint16_t* v;
  std::int64_t k_row_stride, v_row_stride;
  std::int64_t first_key;  // position of the tile's first key among its own key set
  int valid;               // keys of the tile that exist (the rest is zero-filled)
  bool extra;
};

template <typename T, int kD, typename Policy>
__global__ void __launch_bounds__(block_threads<kD, Policy>(), 1)
    forward_kernel(const __grid_constant__ ForwardParams p,
                   const __grid_constant__ ForwardTileMaps maps) {
  constexpr int kM = fwd_block_m<kD, Policy>();
  constexpr int kThreads = fwd_threads<kD, Policy>();  // the math threads
  constexpr bool kCopyWarps = kCopyWarpgroup<kD, Policy>;
  constexpr int kN = fwd_block_n<kD, Policy>();
  constexpr int kStages = stages_of<kD, Policy>();
  constexpr int kScoreTiles = kN / 8;  // n8 accumulator tiles of a warp's 16 x kN scores
  constexpr int kOutTiles = kD / 8;    // n8 accumulator tiles of a warp's 16 x kD output
  using QTile = SwizzledTile<kM, kD>;
  using KVTile = SwizzledTile<kN, kD>;
  using Mask = typename Policy::Mask;
  using Scores = typename Policy::template Scores<T>;
  // Rows and keys gathered from grid boxes (neighborhood attention) instead of sequence ranges.
  constexpr bool kTokenTiles = Mask::kTokenTiles;
  using TokenTiles = FwdTokenTiles<kD, Policy>;
  static_assert(!kTokenTiles || kStages + 2 <= TokenTiles::kSlots,
                "key boxes u - 1 .. u + stages live at once");
  // Token tiles with a copy warpgroup: the copy threads stage each grid tile's boxes
  // (forward_pipeline.cuh), and their arrivals on Q's and the stages' barriers are two each, one
  // that publishes the boxes they wrote and one once their copies have landed.
  constexpr bool kStagedBoxes = kTokenTiles && kCopyWarps;
  constexpr int kCopyArrivals = kStagedBoxes ? 2 : 1;
  // Ping-pong (tile_sizes.h) where the softmax reads nothing that a rendezvous frees: the staged
  // bias tiles of the score modifiers would be overwritten under the follower's softmax.
  constexpr bool kPingPong =
      ping_pong(kD) && !kGeneralForm<Policy> && fwd_warp_groups<kD, Policy>() == 2;
  // P V short of the bucket's last 16 output columns where the value dim leaves them empty
  // (tile_sizes.h), with a copy warpgroup: the general policy, at 255 registers, spilled 56 bytes
  // more with the phase kind it adds.
  constexpr bool kNarrowPv = narrow_pv(kD) && kCopyWarps;
  // The softmax of tile u under the warpgroup's own P(u - 1) V(u - 1) (tile_sizes.h): the range
  // policies without score modifiers, whose softmax has the registers that P(u - 1) keeps.
  constexpr bool kOverlapSoftmax = overlap_softmax(kD) && !kTokenTiles &&
                                   !kGeneralForm<Policy> && !kRelPosForm<Policy> &&
                                   !kBiasForm<Policy> && !kNeighborhoodModifiersForm<Policy>;
  // Overlapped: the wait for P(u - 1) V(u - 1) after the softmax of tile u (tile_sizes.h).
  constexpr bool kPvWaitAfterSoftmax =
      kOverlapSoftmax && pv_wait_after_softmax(kD, !std::is_same_v<Mask, MaskNone>);

  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  const std::uint32_t smem_q = (tile::shared_address(smem_raw) + 1023u) & ~1023u;
  std::uint8_t* const smem_q_ptr = smem_raw + (smem_q - tile::shared_address(smem_raw));
  auto smem_k = [&](int stage) { return smem_q + QTile::kBytes + stage * KVTile::kBytes; };
  auto smem_v = [&](int stage) {
    return smem_q + QTile::kBytes + (kStages + stage) * KVTile::kBytes;
  };
  // Where the epilogue stages the output rows (output_tile()), or each warp's two output chunks
  // (output_chunks(), warp w's at smem_chunks + w * 2 chunks).
  const std::uint32_t smem_o =
      output_tile<kD, Policy>() ? smem_q + input_smem_bytes<kD, Policy>() : smem_q;
  [[maybe_unused]] const std::uint32_t smem_chunks = smem_q + input_smem_bytes<kD, Policy>();
  // The staged bias ring (bias_ring()), bias tile n of the block in slot n % kBiasStages.
  [[maybe_unused]] auto smem_bias_slot = [&](int n) {
    return smem_q + bias_ring_offset<kD, Policy>() + (n % kBiasStages) * BiasTile<kD>::kBytes;
  };
  // The copy warpgroup's barriers follow the tiles and the token-tile bookkeeping.
  constexpr int kBarriersOffset =
      tile_smem_bytes<kD, Policy>() + (kTokenTiles ? static_cast<int>(sizeof(TokenTiles)) : 0);
  static_assert(!kCopyWarps || kBarriersOffset + kSmemAlignSlack +
                                       static_cast<int>(sizeof(StageBarriers<kStages>)) <=
                                   kMaxBlockSmem,
                "the tiles and the copy warpgroup's barriers fit in a block's shared memory");

  // Broadcast from lane 0 so that the compiler sees a warp-uniform value: branches on the role
  // (ping-pong) are then not divergent paths, around which it would serialize the wgmma.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  const int warp = static_cast<int>(threadIdx.x) / 32;  // 16 rows each, in block order
  const int lane = static_cast<int>(threadIdx.x) % 32;

  // A copy warpgroup: set up the barriers (and the zero V tile), then the copy threads fill the
  // stages (the copy role of run_tile) while the math threads go on.
  [[maybe_unused]] StageBarriers<kStages>* bars = nullptr;
  // Whether the tensor-memory accelerator copies Q and the main key tiles (a dense batch whose
  // maps the launcher made); else the copy warpgroup copies them with cp.async.
  [[maybe_unused]] const bool tma = kCopyWarps && !kTokenTiles && maps.usable;
  // Whether the epilogue stores the output rows by TMA (a tile of their own and a map the launcher
  // made), or the math threads store them.
  const bool out_by_tma = output_tile<kD, Policy>() && maps.out_usable;
  // Or through the warps' output chunks by TMA (output_chunks(); the launcher made the map).
  const bool out_by_chunks = output_chunks<kD, Policy>() && maps.out_usable;
  // Whether the epilogue leaves Q's tile alone, which is then free for the next grid tile's Q once
  // the last product has read it (else once the epilogue, which stages the output there, is done).
  [[maybe_unused]] const bool q_free_after_products = output_tile<kD, Policy>() || out_by_chunks;
  // Whether the copy warpgroup stages the bias by TMA (bias_ring(); the launcher made its map), or
  // the math threads load it into registers.
  [[maybe_unused]] const bool staged_bias = bias_ring<kD, Policy>() && maps.bias_usable;
  if constexpr (kCopyWarps) {
    bars = reinterpret_cast<StageBarriers<kStages>*>(smem_q_ptr + kBarriersOffset);
    if (threadIdx.x == 0) {
      init_stage_barriers<kStages, kThreads, kCopyArrivals, bias_ring<kD, Policy>()>(bars);
    }
    if constexpr (zero_v_tile<kD, Policy>()) {
      // Read by the first phase of every grid tile (P = 0 against it; garbage could hold NaN, and
      // 0 x NaN is NaN), through the async proxy.
      zero_shared<KVTile::kBytes, block_threads<kD, Policy>()>(smem_v(kStages));
      fence_proxy_async();
    }
    if constexpr (kStagedBoxes) {  // the key boxes' column tables: one for the whole launch
      reinterpret_cast<TokenTiles*>(smem_q_ptr + tile_smem_bytes<kD, Policy>())
          ->columns.template copy<block_threads<kD, Policy>()>(p.neighborhood);
    }
    __syncthreads();
  }
  // A persistent block's progress over its grid tiles (copy warpgroup; otherwise the block has one
  // tile): the phases so far, which the copy role counts as groups (a tile has as many of each),
  // so that stage slots and barrier parities run on across tiles; and the tiles done, whose count
  // gives Q's barrier parities (they complete once a tile, Q or not).
  int phases_done = 0;
  int q_tiles_done = 0;
  // The staged bias tiles so far (one per main key tile), whose count gives the ring's slots and
  // parities.
  [[maybe_unused]] int bias_tiles_done = 0;

  // One grid tile, for the copy role (copy_role true: the copy warpgroup) or the math role.
  auto run_tile = [&](const BlockCoords& coords, auto copy_role) {
    const std::int64_t b = coords.batch;
    const int h = coords.head;
    // Last row blocks first: under a causal mask they have the most key tiles.
    const std::int64_t m_block = coords.tiles - 1 - coords.tile;

    const SequenceRows rows_of_batch = sequence_rows(p, b);
    const std::int64_t q_start = rows_of_batch.q_start, k_start = rows_of_batch.k_start;
    const std::int64_t num_queries = rows_of_batch.num_queries, num_keys = rows_of_batch.num_keys;
    // Token tiles: the block's rows are tokens of its grid box, so the pointers start at token 0.
    const std::int64_t m0 = kTokenTiles ? 0 : m_block * kM;
    if (m0 >= num_queries)
      return;  // varlen: this sequence is shorter than the longest (both roles)
    // Token tiles: every row may hold a token (a box of a small grid has holes between them).
    const int rows =
        kTokenTiles ? kM : static_cast<int>(num_queries - m0 < kM ? num_queries - m0 : kM);
    [[maybe_unused]] const std::int64_t last_row = m0 + rows - 1;  // range tiles' masks only
    const int hk = h / p.kv_group;

    const auto* q = static_cast<const std::uint16_t*>(p.q) + b * p.q_batch_stride +
                    (q_start + m0) * p.q_row_stride + h * p.q_head_stride;
    const auto* k = static_cast<const std::uint16_t*>(p.k) + b * p.k_batch_stride +
                    k_start * p.k_row_stride + hk * p.k_head_stride;
    const auto* v = static_cast<const std::uint16_t*>(p.v) + b * p.v_batch_stride +
                    k_start * p.v_row_stride + hk * p.v_head_stride;
    const auto* extra_k = static_cast<const std::uint16_t*>(p.extra_k) +
                          b * p.extra_k_batch_stride + hk * p.extra_k_head_stride;
    const auto* extra_v = static_cast<const std::uint16_t*>(p.extra_v) +
                          b * p.extra_v_batch_stride + hk * p.extra_v_head_stride;

    const Mask mask = Mask::make(p, num_queries, num_keys);
    Scores scores = Scores::make(p, b, h, num_queries, num_keys);
    // Staged bias tiles (one per K/V stage) and rel-pos rows follow the K/V stages; token-tile
    // bookkeeping (which has neither) too.
    const std::uint32_t smem_bias = smem_q + tile_smem_bytes<kD, Policy>();
    auto* const tt = reinterpret_cast<TokenTiles*>(smem_q_ptr + (smem_bias - smem_q));
    TileSpan key_tiles{0, 0};  // range masks: the key tiles the block visits
    // Tile counts and indices are 32-bit (a sequence has fewer than 2^31 keys): the loop's index
    // arithmetic (stage = u % stages, comparisons) runs on every tile.
    int main_tiles = 0;
    // Token tiles: the grid tile's query box (one of two where the copy warpgroup stages them).
    QueryBoxSmem<kM>* const qb = &tt->query[kStagedBoxes ? q_tiles_done & 1 : 0];
    // The ring slot of key box j of this grid tile (key boxes are counted over the block's grid
    // tiles, as phases are).
    [[maybe_unused]] auto key_slot = [&](int j) { return (phases_done + j) % TokenTiles::kSlots; };
    // The copy role: this thread's index among the copy warpgroup's.
    [[maybe_unused]] const int copy_thread = static_cast<int>(threadIdx.x) - kThreads;
    [[maybe_unused]] auto copy_threads_sync = [] {
      named_barrier_sync<kCopyBarrier, kCopyThreads>();
    };
    if constexpr (kStagedBoxes && decltype(copy_role)::value) {
      // The copy threads stage the query box (into the buffer that grid tile - 2's epilogue has
      // left) and key box 0; the barrier after them publishes both to the copy threads, whose
      // arrivals on Q's barrier publish them to the math warps.
      if (q_tiles_done >= 2) {
        barrier_wait(&bars->query_box_empty[q_tiles_done & 1], ((q_tiles_done - 2) >> 1) & 1);
      }
      stage_own_query_box<kM, kCopyThreads>(qb, p.neighborhood, static_cast<int>(m_block),
                                            copy_thread, copy_threads_sync);
      main_tiles = qb->tiles.num_seen_tiles;
      if (main_tiles > 0) {
        stage_key_box<kM, kN, kCopyThreads>(tt, *qb, p.neighborhood, 0, key_slot(0), copy_thread);
      }
      copy_threads_sync();
    } else if constexpr (kStagedBoxes) {
      // The math warps: the query box and Q landed.
      barrier_wait(&bars->q_full, q_tiles_done & 1);
      main_tiles = qb->tiles.num_seen_tiles;
    } else if constexpr (kTokenTiles) {
      // The block's query box and key boxes, its rows' tokens and windows, key boxes 0 .. stages
      // - 1.
      main_tiles = static_cast<int>(
          init_query_box<kM, kN, kThreads>(tt, *mask.grid, static_cast<int>(m_block), kStages));
    } else {
      const KeyRange range = mask.key_range(m0, last_row);
      key_tiles = tiles_over(range.begin, range.end, kN);
      main_tiles = static_cast<int>(key_tiles.count);
    }
    const int num_tiles = main_tiles + static_cast<int>((p.num_extra + kN - 1) / kN);

    auto key_source = [&](int u) {
      KeySource t;
      t.extra = u >= main_tiles;
      if (!t.extra && kTokenTiles) {  // gathered by token from key box u (stage_key_box)
        t.first_key = 0;
        t.k_row_stride = p.k_row_stride;
        t.v_row_stride = p.v_row_stride;
        t.k = k;
        t.v = v;
        t.valid = kN;
      } else if (!t.extra) {
        t.first_key = key_tiles.first_row + static_cast<std::int64_t>(u) * kN;
        t.k_row_stride = p.k_row_stride;
        t.v_row_stride = p.v_row_stride;
        t.k = k + t.first_key * p.k_row_stride;
        t.v = v + t.first_key * p.v_row_stride;
        t.valid = static_cast<int>(num_keys - t.first_key < kN ? num_keys - t.first_key : kN);
      } else {
        t.first_key = static_cast<std::int64_t>(u - main_tiles) * kN;
        t.k_row_stride = p.extra_k_row_stride;
        t.v_row_stride = p.extra_v_row_stride;
        t.k = extra_k + t.first_key * p.extra_k_row_stride;
        t.v = extra_v + t.first_key * p.extra_v_row_stride;
        t.valid = static_cast<int>(p.num_extra - t.first_key < kN ? p.num_extra - t.first_key : kN);
      }
      return t;
    };
    const std::uint32_t smem_rel = smem_bias + (p.bias_staged ? kStages * bias_tile_bytes(kD) : 0);
    // Range key tiles of 16-byte rows take the loaders set up once per thread (tiles.cuh); token
    // tiles, extra keys and unaligned rows the general copies.
    constexpr bool kRangeLoads = !kTokenTiles;
    // A paged KV cache's key tiles come through its block table (the KV-cache policies only), by
    // TMA in boxes of pages where the page size allows (tile_copies.cuh: tma_load_pages), else
    // gathered row by row with cp.async (tiles.cuh: load_paged_rows_async).
    const bool paged = kCacheForm<Policy> && p.block_table != nullptr;
    const bool range_loads = kRangeLoads && p.vector_loads && !paged;
    // Or by TMA, in boxes of pages (tma_load_pages), where the launcher made the pool's maps.
    [[maybe_unused]] const bool paged_tiles = paged && tma;
    // Keys t.first_key .. of main tile t from the paged cache (`base`: its page 0, head hk).
    auto load_paged = [&](std::uint32_t dst, const std::uint16_t* base, std::int64_t row_stride,
                          const KeySource& t, int cols, int thread, auto copiers) {
      load_paged_rows_async<kN, kD, decltype(copiers)::value>(
          dst, base, row_stride, p.block_table + b * p.table_batch_stride, p.table_page_stride,
          t.first_key, t.valid, p.page_size, p.page_shift, p.num_pages, cols, p.vector_loads,
          thread);
    };
    const std::uint16_t* const k_range = k + key_tiles.first_row * p.k_row_stride;
    const std::uint16_t* const v_range = v + key_tiles.first_row * p.v_row_stride;
    // Keys of main tile u that exist (the last tile of a range may be partial).
    auto range_rows = [&](int u) {
      const std::int64_t left = num_keys - key_tiles.first_row - static_cast<std::int64_t>(u) * kN;
      return static_cast<int>(left < kN ? left : kN);
    };
    // Main key tiles [0, tma_tiles) come by TMA, the others by the copy threads' cp.async: all
    // of a dense batch's (the maps zero-fill rows past L); over a KV cache those the sequence
    // fills, as rows past its length are stale (cp.async zero-fills them), and over a paged one
    // none where the tiles start inside a box (a window's first key, say).
    [[maybe_unused]] int tma_tiles = tma ? main_tiles : 0;
    if constexpr (kCacheForm<Policy>) {
      if (tma && main_tiles > 0 && range_rows(main_tiles - 1) < kN) --tma_tiles;
      if (paged_tiles && (key_tiles.first_row & (maps.kv_box_rows - 1)) != 0) tma_tiles = 0;
    }
    // K(j) (and its bias tile), V(j), each into the given stage, copied by the threads that
    // `loaders` belong to.
    auto load_k = [&](int j, int stage, const auto& loaders) {
      constexpr int kCopiers = std::decay_t<decltype(loaders)>::kThreads;
      if constexpr (kRangeLoads && std::decay_t<decltype(loaders)>::Loader::kUsable) {
        if (range_loads && j < main_tiles) {
          if constexpr (kGeneralForm<Policy>) {
            static_assert(kCopiers == kThreads, "bias tiles are copied by the math threads");
            if (p.bias_staged) {
              scores.template load_bias_tile_async<kM, kN, kThreads>(
                  smem_bias + stage * bias_tile_bytes(kD), m0,
                  key_tiles.first_row + static_cast<std::int64_t>(j) * kN);
            }
          }
          loaders.k.load(smem_k(stage), j, range_rows(j));
          return;
        }
      }
      const KeySource t = key_source(j);
      if constexpr (kGeneralForm<Policy>) {
        if (p.bias_staged && !t.extra) {
          scores.template load_bias_tile_async<kM, kN, kThreads>(
              smem_bias + stage * bias_tile_bytes(kD), m0, t.first_key);
        }
      }
      if (kTokenTiles && !t.extra) {
        load_rows_async<kN, kD, kCopiers>(smem_k(stage), t.k, t.k_row_stride,
                                          tt->key_token[key_slot(j)], p.head_dim, p.vector_loads,
                                          loaders.thread);
      } else if (paged && !t.extra) {
        load_paged(smem_k(stage), k, p.k_row_stride, t, p.head_dim, loaders.thread,
                   std::integral_constant<int, kCopiers>{});
      } else {
        load_tile_async<kN, kD, kCopiers>(smem_k(stage), t.k, t.k_row_stride, t.valid, p.head_dim,
                                          p.vector_loads, loaders.thread);
      }
    };
    auto load_v = [&](int j, int stage, const auto& loaders) {
      constexpr int kCopiers = std::decay_t<decltype(loaders)>::kThreads;
      if constexpr (kRangeLoads && std::decay_t<decltype(loaders)>::Loader::kUsable) {
        if (range_loads && j < main_tiles) {
          loaders.v.load(smem_v(stage), j, range_rows(j));
          return;
        }
      }
      const KeySource t = key_source(j);
      if (kTokenTiles && !t.extra) {
        load_rows_async<kN, kD, kCopiers>(smem_v(stage), t.v, t.v_row_stride,
                                          tt->key_token[key_slot(j)], p.value_dim, p.vector_loads,
                                          loaders.thread);
      } else if (paged && !t.extra) {
        load_paged(smem_v(stage), v, p.v_row_stride, t, p.value_dim, loaders.thread,
                   std::integral_constant<int, kCopiers>{});
      } else {
        load_tile_async<kN, kD, kCopiers>(smem_v(stage), t.v, t.v_row_stride, t.valid, p.value_dim,
                                          p.vector_loads, loaders.thread);
      }
    };

    // The math warpgroups' part.
    auto math_warps = [&]() {
      // Without a copy warpgroup every thread copies: group j of the pipeline, K(j) (and its bias
      // tile) and V(j - 1), each into the stage of its tile; V trails K by one group because
      // P(j - 1) V(j - 1) is issued with S(j) (below).
      [[maybe_unused]] const KvLoaders<kN, kD, kThreads> all_loaders{
          {k_range, p.k_row_stride, p.head_dim},
          {v_range, p.v_row_stride, p.value_dim},
          static_cast<int>(threadIdx.x)};
      auto load_group = [&](int j) {
        if (j < num_tiles) load_k(j, j % kStages, all_loaders);
        if (j >= 1 && j - 1 < num_tiles) load_v(j - 1, (j - 1) % kStages, all_loaders);
      };

      // Commit groups: {Q, group 0}, {group 1}, .., {group stages - 2}, then one per rendezvous
      // (maybe empty), so that at rendezvous u, which needs group u, exactly stages - 2 later
      // groups may still be in flight.
      if constexpr (!kCopyWarps) {
        if constexpr (kTokenTiles) {
          load_rows_async<kM, kD, kThreads>(smem_q, q, p.q_row_stride, qb->token, p.head_dim,
                                            p.vector_loads);
        } else {
          load_tile_async<kM, kD, kThreads>(smem_q, q, p.q_row_stride, rows, p.head_dim,
                                            p.vector_loads);
        }
        if constexpr (!kRelPosForm<Policy> && !kBiasForm<Policy>) {
          scores.stage_rel_pos(reinterpret_cast<std::uint16_t*>(smem_q_ptr + (smem_rel - smem_q)),
                               m0, kM);
        }
#pragma unroll
        for (int j = 0; j < kStages - 1; ++j) {
          load_group(j);
          tile::cp_async_commit();
        }
      }

      // Rendezvous u of all threads (see the header): group u (K(u), V(u - 1)) has landed for
      // everyone, and every warp is done with the stages that group u + stages - 1 overwrites.
      auto rendezvous = [&](int u) {
        rendezvous_then_load<kStages - 2, kThreads>([&] {
          if (u + kStages - 1 <= num_tiles) load_group(u + kStages - 1);
        });
        if constexpr (kTokenTiles) {
          // Key box u + stages into the slot of box u + stages - kSlots, which no warp reads any
          // more (its last reader, the follower's softmax of that tile, ran before this
          // rendezvous); its K loads are issued at the next rendezvous.
          if (u + kStages < main_tiles) {
            stage_key_box<kM, kN, kThreads>(tt, *qb, *mask.grid, u + kStages,
                                            key_slot(u + kStages));
          }
        }
      };

      // Row of accumulator entries 0, 1 (+8 for entries 2, 3).
      const std::int64_t fragment_row = m0 + warp * 16 + lane / 4;
      const int fragment_col = 2 * (lane % 4);  // +1 for entries 1, 3
      const int q_first_row = warpgroup * 64;

      // Rel-pos register form: this thread's rel_w entries for the whole block, and rel_h of tile u
      // fetched at the softmax of tile u - 1 (tile 0's here). Main tiles start at key 0 (no mask).
      constexpr int kRuns = kRelPosForm<Policy> ? 2 : 1;
      [[maybe_unused]] float rel_w[kRelPosForm<Policy> ? kScoreTiles / 2 : 1][4];
      [[maybe_unused]] RelHRows rel_h_rows{};
      [[maybe_unused]] RelHFetch<2> rel_h_next{};
      if constexpr (kRelPosForm<Policy>) {
        scores.load_rel_w(rel_w, fragment_row, fragment_col);
        rel_h_rows = scores.rel_h_rows(fragment_row);
        rel_h_next = scores.template fetch_rel_h<2>(rel_h_rows, 0);
      }
      // Bias register form: this thread's bias of tile u, fetched at the softmax of tile u - 1
      // (tile 0's here).
      [[maybe_unused]] BiasFetch<kBiasForm<Policy> ? kScoreTiles : 1> bias_next{};
      [[maybe_unused]] BiasRows bias_rows{};
      if constexpr (kBiasForm<Policy>) {
        bias_rows = scores.rows(fragment_row);
        if (main_tiles > 0 && !staged_bias) {
          scores.fetch(bias_next, bias_rows, key_tiles.first_row + fragment_col);
        }
      }

      float o[kOutTiles][4];
      float s[kScoreTiles][4];
#pragma unroll
      for (int t = 0; t < kOutTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
      // Overlapped: P(u - 1), packed at the end of phase u - 1 (0 before the first), the A
      // operand of phase u's P V. Packed there rather than at the issue, so that no instruction
      // reads S's registers in the run of products that writes them.
      [[maybe_unused]] std::uint32_t p_packed[kN / 16][4];
      if constexpr (kOverlapSoftmax) {
#pragma unroll
        for (int t = 0; t < kN / 16; ++t) p_packed[t][0] = p_packed[t][1] = p_packed[t][2] = p_packed[t][3] = 0u;
      }
      OnlineSoftmax softmax;
      softmax.init();
      // The plain scale is folded into the exponentials' FMA (one multiply less per score) when it
      // is positive, which keeps the order of the scores and -inf as -inf; else it is applied
      // first. (Unreferenced where the policy's softmax takes no branch on it.)
      [[maybe_unused]] bool scale_folded = false;
      float exp_scale = 1.0f;
      if constexpr (std::is_same_v<Scores, ScoreScale>) {
        scale_folded = scores.scale_log2 > 0.0f;
        if (scale_folded) exp_scale = scores.scale_log2;
      } else if constexpr (kBiasForm<Policy>) {
        exp_scale = Scores::kExpScale;  // its scores come in natural units
      }

      [[maybe_unused]] const bool follower = kPingPong && warpgroup == 1;
      // Whether the products take the bucket's whole head dim: else S skips its last k-step, which
      // would hold zero columns only, and with kNarrowPv P V its last 16 output columns, when the
      // value dim leaves them empty too (else both keep them).
      const bool full_dim = p.head_dim > kD - 16 || (kNarrowPv && p.value_dim > kD - 16);
      const int num_phases = num_tiles > 0 ? num_tiles + 1 : 0;
      if constexpr (!kCopyWarps) {
        // Phase 0 issues O += P(-1) V(-1) too, with P = 0 (s starts at zero; kFirstPhasePv). The
        // V stage it reads, the last one, first receives a tile at rendezvous 1 (group `stages`,
        // V(stages - 1)): zeroed here, as garbage could hold NaN and 0 x NaN is NaN, and published
        // by rendezvous 0's fence and barrier. With a copy warpgroup phase 0 reads the zero V tile.
        zero_shared<KVTile::kBytes, kThreads>(smem_v(kStages - 1));
        if (follower && num_phases > 0) rendezvous(0);
      }
      // Phase u of the grid tile, of kind kAnyPhase (which kind u makes is a runtime question), or
      // overlapped (kOverlapSoftmax) kFirstPhase (S only), kMiddlePhase (S, then P V) or
      // kLastPhase (P V only).
      auto run_phase = [&](const int u, auto kind) {
        const int g = phases_done + u;  // the phase among the block's (stage slot g % stages)
        if constexpr (kCopyWarps) {
          // The turns: the follower issues phase u after the leader did, the leader phase u after
          // the follower issued phase u - 1. Then the phase's stage (and Q before the first).
          if constexpr (kPingPong) {
            if (follower) {
              named_barrier_sync<kTurnBarrier, kThreads>();
            } else if (g > 0) {
              named_barrier_sync<kTurnBackBarrier, kThreads>();
            }
          }
          if (!kStagedBoxes && u == 0) barrier_wait(&bars->q_full, q_tiles_done & 1);
          barrier_wait(&bars->full[g % kStages], (g / kStages) & 1);
          // Tiles that cp.async wrote (the generic proxy) are read by the tensor cores next.
          if (u == 0 || u >= tma_tiles) fence_proxy_async();
        } else {
          if (!follower) rendezvous(u);
          if constexpr (kPingPong) {
            if (follower)
              named_barrier_sync<kTurnBarrier, kThreads>();  // the leader issued phase u
          }
        }

        // Phase u: O += P(u - 1) V(u - 1) (P = 0 at u = 0, or none: kFirstPhasePv), then S(u) = Q
        // K(u)^T over the head dim (u < num_tiles), one wgmma group issued as one straight run from
        // the fence to the commit: a branch inside the run makes ptxas end the group there and
        // inject warpgroup.arrive (warning C7519) before the next product; with those branches the
        // D 64 kernel also took 33 registers more. So the kinds of phase (with S over all k-steps
        // of the bucket and P V over all its output columns, or both short of the last 16 when they
        // would hold zero columns only, D 80 in bucket 96; the last phase, without S; the first
        // without P V) are runs of their own, chosen before the fence. Inside a run, P is packed
        // before the accumulators' fences: packed after them, ptxas ran short of registers at D 128
        // and serialized the wgmma (C7512; 1.39 -> 2.07 ms at SAM-B's shape).
        // Overlapped, the phase's kind is known at compile time: ptxas follows the products in
        // flight without telling runtime branches apart, so a wait or a read of O that only some
        // kinds need would make it inject waits of its own and serialize the products (C7514,
        // C7515).
        constexpr int kKind = decltype(kind)::value;
        const bool has_s = kKind == kAnyPhase ? u < num_tiles : kKind != kLastPhase;
        const int k_stage = g % kStages;
        const int v_stage =
            zero_v_tile<kD, Policy>() && u == 0 ? kStages : (g - 1 + kStages) % kStages;
        auto issue_phase = [&](auto with_pv, auto with_s, auto short_dims) {
          constexpr bool kShort = decltype(short_dims)::value;
          [[maybe_unused]] std::uint32_t a[kN / 16][4];
          if constexpr (decltype(with_pv)::value) {
            if constexpr (kOverlapSoftmax) {
              fence_fragments(p_packed);
            } else {
              pack_fragments<T>(s, a);
              fence_fragments(a);
            }
            fence_accumulators(o);
          }
          fence_accumulators(s);
          wgmma_fence();
          if constexpr (kOverlapSoftmax && decltype(with_s)::value) {
            // S(u) in a group of its own, first: the softmax waits for it alone. P V starts a
            // pipeline stage of its own (the fence): ptxas serializes every product when the
            // softmax defines S's registers inside the stage of a product still in flight (C7515).
            ss_product<T, kShort ? kD / 16 - 1 : kD / 16, QTile, KVTile>(s, smem_q, q_first_row,
                                                                         smem_k(k_stage));
            wgmma_commit();
            wgmma_fence();
          }
          if constexpr (decltype(with_pv)::value) {
            if constexpr (kShort && kNarrowPv) {
              // The first kOutTiles - 2 accumulator tiles, the product's 64 x (D - 16) block.
              rs_product<T, kN / 16, KVTile>(reinterpret_cast<float(&)[kOutTiles - 2][4]>(o),
                                             kOverlapSoftmax ? p_packed : a, smem_v(v_stage));
            } else {
              rs_product<T, kN / 16, KVTile>(o, kOverlapSoftmax ? p_packed : a, smem_v(v_stage));
            }
          }
          if constexpr (!kOverlapSoftmax && decltype(with_s)::value) {
            ss_product<T, kShort ? kD / 16 - 1 : kD / 16, QTile, KVTile>(s, smem_q, q_first_row,
                                                                         smem_k(k_stage));
          }
          // Overlapped, S(u) is never the youngest group: the first phase, without P V, commits
          // an empty one after it, so that a wait for all but one group covers S(u) on every path
          // ptxas sees (it does not tell the phase kinds apart).
          wgmma_commit();
        };
        using Yes = std::true_type;
        using No = std::false_type;
        if (kKind == kFirstPhase || (kKind == kAnyPhase && !kFirstPhasePv<kD, Policy> && u == 0)) {
          if constexpr (!kFirstPhasePv<kD, Policy>) {
            if (full_dim) {
              issue_phase(No{}, Yes{}, No{});
            } else {
              issue_phase(No{}, Yes{}, Yes{});
            }
          }
        } else if (kKind == kLastPhase || (kKind == kAnyPhase && !has_s)) {
          if (!kNarrowPv || full_dim) {
            issue_phase(Yes{}, No{}, No{});
          } else {
            issue_phase(Yes{}, No{}, Yes{});
          }
        } else if (full_dim) {
          issue_phase(Yes{}, Yes{}, No{});
        } else {
          issue_phase(Yes{}, Yes{}, Yes{});
        }
        if constexpr (kPingPong) {
          if (!follower) {
            named_barrier_arrive<kTurnBarrier, kThreads>();
          } else if (kCopyWarps) {  // the leader's last wait is after its last tile
            named_barrier_arrive<kTurnBackBarrier, kThreads>();
          }
        }
        // After both products of the phase: the stage is free to refill, and (without a copy
        // warpgroup) the follower's next rendezvous.
        auto phase_done = [&] {
          fence_accumulators(o);
          if constexpr (kCopyWarps) {
            __syncwarp();
            if (lane == 0) barrier_arrive(&bars->empty[k_stage]);  // the stage is free to refill
            // The last product that reads Q (with the output staged in Q's tile, the epilogue).
            if (q_free_after_products && u == num_tiles - 1) barrier_arrive(&bars->q_empty);
          } else {
            if (follower && u + 1 < num_phases) rendezvous(u + 1);
          }
        };
        // Overlapped: P(u - 1) V(u - 1) still runs (the group after S(u)) while the softmax does.
        constexpr bool pv_running = kKind == kMiddlePhase;
        if constexpr (pv_running) {
          wgmma_wait<1>();
        } else {
          wgmma_wait<0>();
          phase_done();
        }
        fence_accumulators(s);
        if (!has_s) return;

        const KeySource tile = key_source(u);
        const std::int64_t first_col = tile.first_key + fragment_col;
        bool full = tile.valid == kN;  // extra keys (token tiles: gathered_scores reads its own)
        if constexpr (!kTokenTiles) {
          full =
              tile.extra ? tile.valid == kN : mask.tile_is_full(m0, last_row, tile.first_key, kN);
        }
        float offset[2][kRuns] = {};  // per-row offsets of the tile's halves (rel_h)
        if constexpr (kRelPosForm<Policy>) {
          if (!tile.extra) {
            scores.scale_and_add_w(s, rel_w);
            scores.rel_h_offsets(rel_h_next, offset);
            rel_h_next = scores.template fetch_rel_h<2>(rel_h_rows, tile.first_key + kN);
          } else {
            scores.transform(s);
          }
        } else if constexpr (kBiasForm<Policy>) {
          if (!tile.extra && staged_bias) {
            // The tile's staged bias; the slot is handed back once the pairs are used (so the
            // loads are done).
            const int n = bias_tiles_done + u;
            barrier_wait(&bars->bias_full[n % kBiasStages], (n / kBiasStages) & 1);
            const std::uint32_t slot = smem_bias_slot(n);
            Scores::fetch_staged(
                bias_next, [slot](int r, int c) { return slot + BiasTile<kD>::chunk_offset(r, c); },
                warp * 16, lane);
            scores.scale_and_add(s, bias_next);
            barrier_arrive(&bars->bias_empty[n % kBiasStages]);
          } else if (!tile.extra) {
            scores.scale_and_add(s, bias_next);
            if (u + 1 < main_tiles) scores.fetch(bias_next, bias_rows, first_col + kN);
          } else {
            scores.transform(s);
          }
        } else if (!scale_folded) {
          scores.transform(s);
        }
        if (kTokenTiles && !tile.extra) {
          // m0 is 0: fragment_row is the block-local row.
          if constexpr (kTokenTiles) {
            gathered_scores(tt, *qb, key_slot(u), scores, s, static_cast<int>(fragment_row),
                            fragment_col);
          }
        } else if (!tile.extra) {
          if constexpr (kGeneralForm<Policy>) {
            if (p.bias_staged) {
              scores.add_bias_tile(
                  s, fragment_row, first_col,
                  smem_q_ptr + (smem_bias - smem_q) + k_stage * bias_tile_bytes(kD),
                  warp * 16 + lane / 4);
            } else {
              scores.add_bias(s, fragment_row, first_col);
            }
          }
          if (!full) hide_invisible(mask, s, fragment_row, first_col);
        } else if (!full) {
          // Extra keys: visible to every query, no bias or rel-pos (softcap applies, above).
          hide_invisible(MaskNone{p.num_extra}, s, fragment_row, first_col);
        }
        if constexpr (kOverlapSoftmax) {
          float rescale[2];
          softmax_scores(softmax, s, rescale, exp_scale, offset);
          // The first phase's O is still zero: nothing to rescale there.
          if constexpr (pv_running && kPvWaitAfterSoftmax) {
            // The wait in both arms of the vote's branch, where ptxas leaves it.
            if (output_rescaled(rescale)) {
              wgmma_wait<0>();
              phase_done();
              scale_output(o, rescale);
            } else {
              wgmma_wait<0>();
              phase_done();
            }
          } else if constexpr (pv_running) {
            wgmma_wait<0>();
            phase_done();
            rescale_output(o, rescale);
          }
          pack_fragments<T>(s, p_packed);
        } else {
          softmax_update(softmax, s, o, exp_scale, offset);
        }
      };
      for (int u = 0; u < num_phases; ++u) {
        if constexpr (kOverlapSoftmax) {
          if (u == num_tiles) {
            run_phase(u, std::integral_constant<int, kLastPhase>{});
          } else if (!kFirstPhasePv<kD, Policy> && u == 0) {
            run_phase(u, std::integral_constant<int, kFirstPhase>{});
          } else {
            run_phase(u, std::integral_constant<int, kMiddlePhase>{});
          }
        } else {
          run_phase(u, std::integral_constant<int, kAnyPhase>{});
        }
      }

      // Epilogue. Each warp stages its own 16 rows in its own rows of the output tile (Q's tile
      // or one of its own: output_tile(); only its warpgroup's products ever read those rows of Q,
      // and they are done), then stores them in 16-byte chunks; or it stages them a column block
      // at a time in output chunks of its own (output_chunks()). Without a copy warpgroup, Q's
      // copy must have landed before its rows are reused for the output (it is still in flight
      // when the block had no key tile at all, and other threads copied this warp's rows: hence a
      // block barrier, found by racecheck). With one, the warp's reads of its previous grid tile's
      // rows come before these writes (__syncwarp).
      if constexpr (!kCopyWarps) {
        tile::cp_async_wait<0>();
        __syncthreads();
      }
      const float sink_log2 = p.sinks != nullptr ? p.sinks[h * p.sinks_stride] * kLog2e : -INFINITY;
      float factor[2], lse[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) factor[r] = softmax.finish_row(r, sink_log2, &lse[r]);
      if (p.lse != nullptr && lane % 4 == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const std::int64_t i =
              kTokenTiles ? qb->token[fragment_row + 8 * r] : fragment_row + 8 * r;
          if ((!kTokenTiles || i >= 0) && i < num_queries) {  // token -1: past the grid
            p.lse[b * p.lse_batch_stride + h * p.lse_head_stride +
                  (q_start + i) * p.lse_row_stride] = lse[r];
          }
        }
      }
      if constexpr (kCopyWarps) {
        __syncwarp();
        // A tile without key tiles waits for Q's barrier here: Q's tile must hold no copy in
        // flight, and each phase of the barrier is waited for in turn.
        if (!kStagedBoxes && num_phases == 0) barrier_wait(&bars->q_full, q_tiles_done & 1);
      }
      if (out_by_chunks) {
        if constexpr (output_chunks<kD, Policy>()) {
          const std::uint32_t chunks = smem_chunks + warp * kOutChunksPerWarp * OutChunk::kBytes;
          store_output_by_chunks<T, OutChunk, kOutChunksPerWarp>(
              o, factor, chunks, smem_q_ptr + (chunks - smem_q), maps.out, m0 + warp * 16, h, b,
              p.value_dim, lane);
        }
      } else {
        // The warp's rows of the output tile, free again once the bulk stores of its previous
        // grid tile have read them (out_by_tma).
        if (out_by_tma) {
          if (lane == 0) ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<0>{});
          __syncwarp();
        }
        stage_output_rows<T, QTile>(o, factor, smem_o, warp * 16, lane);
        const std::uint8_t* const staged_rows = smem_q_ptr + (smem_o - smem_q);
        if (out_by_tma) {
          // Every lane's rows made visible to the bulk copy, which lane 0 issues: the math warps
          // go on to the next grid tile while it stores them.
          fence_proxy_async();
          __syncwarp();
          if (lane == 0) {
            tma_store_rows<QTile>(staged_rows + warp * 16 * QTile::kSwizzleBytes, maps.out,
                                  m0 + warp * 16, h, b, p.value_dim);
            ::cuda::ptx::cp_async_bulk_commit_group();
          }
        } else {
          __syncwarp();
          const int warp_rows = rows - warp * 16;  // rows of this warp that exist (may be <= 0)
          // Token tiles address rows by token: their pointer starts at token 0.
          auto* out = static_cast<std::uint16_t*>(p.out) + b * p.out_batch_stride +
                      (q_start + m0 + (kTokenTiles ? 0 : warp * 16)) * p.out_row_stride +
                      h * p.out_head_stride;
          store_output_rows<kD, kTokenTiles, QTile>(p, out, staged_rows, warp * 16, warp_rows,
                                                    kTokenTiles ? qb->token : nullptr, lane);
        }
      }
      // The query box's buffer is free for grid tile + 2 once this warp's reads of it are done.
      if constexpr (kStagedBoxes) {
        __syncwarp();
        if (lane == 0) barrier_arrive(&bars->query_box_empty[q_tiles_done & 1]);
      }
      // Q's tile is free for the next grid tile's Q once this thread's reads are done.
      if constexpr (kCopyWarps) {
        if (!q_free_after_products || num_phases == 0) barrier_arrive(&bars->q_empty);
      }
    };

    if constexpr (decltype(copy_role)::value) {
      // The copy role: group j = K(j), V(j - 1) into stage slot g % stages, g = the group among
      // the block's (phases_done + j), once the math warps have left its last use (phase g -
      // stages); each thread arrives once per fill, after its own copies; thread 0 announces the
      // bytes of the fill's TMA copies first. Q of a later grid tile waits until the previous
      // tile's Q is read (q_empty): by its last product where the output has a tile of its own
      // (before that tile's last phase and epilogue, under which the next tile's first groups
      // land), else by its epilogue.
      // The threads that copy with cp.async: up to D 128 a multiple of the head dim, so that the
      // range loaders (16-byte chunks, whole rows, 8 rows a pass) apply: 96 of the 128 at D 96.
      // The general copies inside the tile loop spilled the copy threads (Q's at D 128: 544 bytes
      // at 40 registers; D 96 800 bytes). Above D 128 four rows a pass (80 .. 128 threads), which
      // the range loaders take too.
      constexpr int kCopiers = kD <= kCopyThreads ? kCopyThreads / kD * kD : kD / 2;
      const bool copier = kCopiers == kCopyThreads || copy_thread < kCopiers;
      const KvLoaders<kN, kD, kCopiers> loaders{{k_range, p.k_row_stride, p.head_dim, copy_thread},
                                                {v_range, p.v_row_stride, p.value_dim, copy_thread},
                                                copy_thread};
      // Each copy thread's arrival: after its cp.async copies, or, where rows are copied element by
      // element (no 16-byte rows: plain shared-memory stores, no cp.async), a plain arrival, which
      // releases those stores.
      // Token tiles: first a plain arrival, which releases the boxes staged so far.
      auto arrive = [&](std::uint64_t* bar) {
        if constexpr (kStagedBoxes) barrier_arrive(bar);
        if (p.vector_loads) {
          barrier_arrive_after_copies(bar);
        } else {
          barrier_arrive(bar);
        }
      };
      using QLoader = RangeTileLoader<kM, kD, kCopiers>;
      // Q's barriers complete once a grid tile, Q or not (a tile without key tiles reads no Q, but
      // its epilogue may stage in Q's tile): each waits for the previous one's readers. Q by TMA
      // comes after K(0) (in the loop): its wait for the previous tile's epilogue (where Q's tile
      // stages the output) then holds back no copy that the first phase needs. (With the cp.async
      // copies of Q in the loop, the copy threads spilled 200-400 bytes: those stay before it.)
      auto wait_q_free = [&]() {
        if (q_tiles_done > 0) barrier_wait(&bars->q_empty, (q_tiles_done - 1) & 1);
      };
      const int num_groups = num_tiles > 0 ? num_tiles + 1 : 0;
      if (num_groups == 0 || !tma) {
        wait_q_free();
        if (num_tiles == 0 || !copier) {
        } else if (kTokenTiles) {
          load_rows_async<kM, kD, kCopiers>(smem_q, q, p.q_row_stride, qb->token, p.head_dim,
                                            p.vector_loads, copy_thread);
        } else if (QLoader::kUsable && p.vector_loads) {
          if constexpr (QLoader::kUsable) {
            QLoader{q, p.q_row_stride, p.head_dim, copy_thread}.load(smem_q, 0, rows);
          }
        } else {
          load_tile_async<kM, kD, kCopiers>(smem_q, q, p.q_row_stride, rows, p.head_dim,
                                            p.vector_loads, copy_thread);
        }
        arrive(&bars->q_full);
      }
      for (int j = 0; j < num_groups; ++j) {
        const int g = phases_done + j;
        const int slot = g % kStages, v_slot = (g - 1 + kStages) % kStages;
        if (g >= kStages) barrier_wait(&bars->empty[slot], (g / kStages - 1) & 1);
        const bool has_k = j < num_tiles, has_v = j >= 1;
        const bool k_by_tma = j < tma_tiles, v_by_tma = has_v && j - 1 < tma_tiles;
        if (paged_tiles && copy_thread < 32 && (k_by_tma || v_by_tma)) {
          // A paged cache's tiles: a page's box a lane of the first copy warp.
          if (copy_thread == 0) {
            barrier_expect_bytes(&bars->full[slot],
                                 (k_by_tma ? KVTile::kBytes : 0) + (v_by_tma ? KVTile::kBytes : 0));
          }
          __syncwarp();
          const int first = static_cast<int>(key_tiles.first_row) + j * kN;
          if (k_by_tma) {
            tma_load_pages<KVTile>(smem_q_ptr + (smem_k(slot) - smem_q), maps.k, p, b, first,
                                   maps.kv_box_rows, hk, &bars->full[slot], copy_thread);
          }
          if (v_by_tma) {
            tma_load_pages<KVTile>(smem_q_ptr + (smem_v(v_slot) - smem_q), maps.v, p, b,
                                   first - kN, maps.kv_box_rows, hk, &bars->full[slot],
                                   copy_thread);
          }
        } else if (copy_thread == 0 && (k_by_tma || v_by_tma)) {
          barrier_expect_bytes(&bars->full[slot],
                               (k_by_tma ? KVTile::kBytes : 0) + (v_by_tma ? KVTile::kBytes : 0));
          const std::int64_t first = key_tiles.first_row + static_cast<std::int64_t>(j) * kN;
          if (k_by_tma) {
            tma_load_tile<KVTile>(smem_q_ptr + (smem_k(slot) - smem_q), maps.k, first, hk, b,
                                  &bars->full[slot]);
          }
          if (v_by_tma) {
            tma_load_tile<KVTile>(smem_q_ptr + (smem_v(v_slot) - smem_q), maps.v, first - kN, hk, b,
                                  &bars->full[slot]);
          }
          // K(j)'s bias into its ring slot, once both warpgroups' softmax of the bias tile two
          // before is done with it. (This thread's arrival on full[slot] waits too: the phase that
          // needs the slot comes after that softmax anyway.)
          if constexpr (bias_ring<kD, Policy>()) {
            if (staged_bias && k_by_tma) {
              const int n = bias_tiles_done + j;
              std::uint64_t* const full = &bars->bias_full[n % kBiasStages];
              if (n >= kBiasStages) {
                barrier_wait(&bars->bias_empty[n % kBiasStages], (n / kBiasStages - 1) & 1);
              }
              barrier_arrive_expect_bytes(full, BiasTile<kD>::kBytes);
              tma_load_bias_tile<BiasTile<kD>>(smem_q_ptr + (smem_bias_slot(n) - smem_q), maps.bias,
                                               p, m0, h, b, first, full);
            }
          }
        }
        if (copier && has_k && !k_by_tma) load_k(j, slot, loaders);
        if (copier && has_v && !v_by_tma) load_v(j - 1, v_slot, loaders);
        // Token tiles: key box j + 1, published to the math warps by the arrivals below and to
        // the copy threads (whose next group gathers its rows) by their barrier.
        if constexpr (kStagedBoxes) {
          if (j + 1 < main_tiles) {
            stage_key_box<kM, kN, kCopyThreads>(tt, *qb, p.neighborhood, j + 1, key_slot(j + 1),
                                                copy_thread);
          }
        }
        arrive(&bars->full[slot]);
        if constexpr (kStagedBoxes) copy_threads_sync();
        if (j == 0 && tma) {
          wait_q_free();
          if (copy_thread == 0) {
            barrier_expect_bytes(&bars->q_full, QTile::kBytes);
            tma_load_tile<QTile>(smem_q_ptr, maps.q, m0, h, b, &bars->q_full);
          }
          arrive(&bars->q_full);
        }
      }
    } else {
      math_warps();
    }
    phases_done += num_tiles > 0 ? num_tiles + 1 : 0;
    ++q_tiles_done;
    bias_tiles_done += main_tiles;
  };  // run_tile

  if constexpr (kCopyWarps) {
    // Persistent blocks (forward_pipeline.cuh: walk_grid_tiles). The roles split once (ptxas gives
    // each branch of one if / else the registers its setmaxnreg sets).
    auto tile_runner = [&](auto copy_role) {
      return [&, copy_role](uint3 index, dim3 tiles) {
        run_tile(block_coords<kBiasForm<Policy>>(p, index, tiles), copy_role);
      };
    };
    if (threadIdx.x >= kThreads) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(copy_registers<kD, Policy>()));
      walk_grid_tiles<true, kThreads>(p, bars, lane, tile_runner(std::true_type{}));
      tile::cp_async_wait_all();  // no thread leaves with copies in flight
    } else {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(math_registers<kD, Policy>()));
      walk_grid_tiles<false, kThreads>(p, bars, lane, tile_runner(std::false_type{}));
      // No thread leaves with its output stores in flight.
      if ((out_by_tma || out_by_chunks) && lane == 0) {
        ::cuda::ptx::cp_async_bulk_wait_group(::cuda::ptx::n32_t<0>{});
      }
      // The follower arrived after each of its phases: the leader's wait for the last one.
      if (kPingPong && warpgroup == 0 && phases_done > 0) {
        named_barrier_sync<kTurnBackBarrier, kThreads>();
      }
    }
  } else {
    run_tile(block_coords<kBiasForm<Policy>>(p), std::false_type{});
  }
}

}  // namespace fmha::cuda::sm90
