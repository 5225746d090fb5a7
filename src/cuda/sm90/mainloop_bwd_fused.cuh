// The fused backward on Hopper with warp specialization (sm_90a only): dK, dV and dQ in one pass
// over the score tiles, each product once (5 a tile pair, where the split backward's two kernels
// do 7), for the plain, window (causal) and softcap policies at head-dim buckets 64 and 128.
//
// A block owns kN = 128 keys of one (batch, kv head) and walks the query tiles that see them, for
// every query head of the kv head's GQA group (dK and dV summed over the group in registers: K and
// V are never expanded). Its three warpgroups have one job each:
//   producer (warpgroup 0, 40 registers a thread): warp 0 copies K and V once and then, two stages
//     ahead, each step's Q and dO tiles by TMA and their rows' lse and Delta by bulk copies, into
//     stage slots whose `full` mbarriers the math warps wait on and whose `empty` mbarriers they
//     release; warp 1 adds each step's dQ to the fp32 accumulator (dq_accumulator.cuh) by bulk
//     reductions while the math warps go on; warps 2 and 3 leave.
//   math (warpgroups 1 and 2, 240 registers): warpgroup w owns keys [64w, +64) of the block, the
//     M of its products, so S^T and dP^T come out with keys as rows, which is the A-fragment
//     layout of dV += P^T dO and dK += dS^T Q: P^T and dS^T feed those from registers.
// A step (one query tile of one head) of math warpgroup w:
//   S^T = K_w Q^T, dP^T = V_w dO^T          (two wgmma groups; exp(S) runs under dP)
//   P^T = exp2(scale S^T - lse), dS^T = P^T (dP^T - Delta)
//   dV += P^T dO                             (issued, not waited for)
//   dS^T -> shared memory (stmatrix; two tiles by step parity), one barrier of both warpgroups
//   dQ_w = dS K                              (D 128: all queries x head-dim columns [64w, +64);
//                                             D 64: queries [64w, +64) x all columns)
//   dK += dS^T Q
//   wait for dV and dQ; dQ_w -> its staging tile (the accumulator's chunk order), handed to the
//   writer warp; wait for dK; release the stage.
// Softcap (PolicySoftcap) runs tanh(scale S^T / softcap) under dP^T instead of exp(S), and after it
// P^T = exp2(softcap tanh - lse), dS^T = P^T (dP^T - Delta) (1 - tanh^2) from the tanh kept in S^T's
// registers (backward_policies.cuh: softcap_tanh_tiles). ptxas (CUDA 13.0, sm_90a): no spill at
// D 128, 64 bytes of loop-invariant values at D 64 (the window policy's kernel: 32). Packing P^T
// before dP^T's wait instead, so that its exponentials also run under dP^T, spilled 64 bytes at
// D 128 (P^T's 16-bit fragments and P^T (1 - tanh^2) both live across the wait).
// The writer waits until the bulk reductions have read the staging tiles before handing them back,
// never until they have added: the adds run in L2 under the next steps.
//
// Named barriers (ids of this kernel): the dS^T barrier of the 256 math threads (also the
// epilogue's), and per math warpgroup a `dq_full` (the warpgroup arrives, the writer waits) and a
// `dq_empty` (the writer arrives, the warpgroup waits), of 128 + 32 threads each.
// Deterministic mode (p.dq_semaphore set): the key blocks that see a query tile add to it in a
// fixed order. Before its reductions into a tile the writer waits until the tile's counter equals
// the block's place among them, and after the adds have completed it increments the counter. The
// dK/dV sums are the block's own, so the whole backward is bitwise repeatable. The order follows
// when the blocks reach the tile: without a right window bound every block walks the queries from
// the first, so they go by ascending key block (place = key block minus the first key block the
// tile sees, from the mask's key_range of its rows); under a right bound (causal) a later key
// block starts at later queries and reaches each tile before the earlier ones, so they go by
// descending key block (place = the last key block the tile sees minus the block's), and the grid
// runs the blocks from the last key tile (key_block). Either way a block waits only for blocks the
// hardware starts no later than it (the grid's key tiles are its fastest index, head sections keep
// them in order), so the wait always ends. Only the writer waits: the math warps stall only once
// their staging tiles are still unread. Measured on an H100 (bf16, 2026-11-27, kernels alone):
// +1-32% over the unordered adds without a mask (the L 1024-4096 cells the most: each key block
// of a head adds a tile one completed reduction after the one before it), +1-22% under causal
// masks.
// Deadlock freedom: every count that picks a branch (num_steps, m_tiles) is the block's own; the
// producer fills stage u % 2 for step u only after the math warps released step u - 2, which
// they do at the end of it, after the writer took step u - 2's dQ (dq_empty before the staging of
// step u - 1). The writer pre-arrives dq_empty once and then after each step but the last, so each
// warpgroup's num_steps waits meet num_steps arrivals.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda/ptx>
#include <type_traits>

#include "cuda/common/backward_params.h"
#include "cuda/common/backward_policies.cuh"
#include "cuda/common/block_coords.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm90/dq_accumulator.cuh"
#include "cuda/sm90/fp32_planes.cuh"
#include "cuda/sm90/tile_copies.cuh"
#include "cuda/sm90/tile_sizes_bwd.h"
#include "cuda/sm90/tiles.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace fmha::cuda::sm90 {

// Tensor maps of the streamed operands: K and V in the block's key tile, Q and dO in query tiles.
struct FusedBackwardMaps {
  RowsMap q, k, v, dout;
};

struct FusedBackwardBarriers {
  std::uint64_t kv_full;     // K and V landed
  std::uint64_t q_full[2];   // a stage's Q tile and lse rows landed
  std::uint64_t do_full[2];  // its dO tile and Delta rows landed
  std::uint64_t empty[2];    // no math warp reads the stage any more
};

// Shared memory of a block, from a 1024-byte aligned base (the swizzle period).
template <int kD>
struct FusedBackwardSmem {
  static constexpr int kN = kBwdFusedKeysPerBlock;
  static constexpr int kM = bwd_fused_queries_per_tile(kD);
  static constexpr int kStages = 2;
  using KTile = SwizzledTile<kN, kD>;
  using QTile = SwizzledTile<kM, kD>;
  using DsTile = SwizzledTile<kN, kM>;  // dS^T: rows = keys, columns = queries
  static constexpr int kStagingBytes = DqAccumulator<kD>::kChunkFloats * 4;
  static constexpr int kK = 0;
  static constexpr int kV = kK + KTile::kBytes;
  static constexpr int kQ = kV + KTile::kBytes;
  static constexpr int kDout = kQ + kStages * QTile::kBytes;
  static constexpr int kDs = kDout + kStages * QTile::kBytes;
  static constexpr int kStaging = kDs + kStages * DsTile::kBytes;
  static constexpr int kLse = kStaging + 2 * kStagingBytes;
  static constexpr int kDelta = kLse + kStages * kM * 4;
  static constexpr int kBarriers = kDelta + kStages * kM * 4;
  static constexpr int kBytes = kBarriers + static_cast<int>(sizeof(FusedBackwardBarriers));
  static constexpr int kLaunchBytes = kBytes + 1024;  // the base rounded up to 1024 bytes
  static_assert(kLaunchBytes <= 227 * 1024, "fits an sm90 block");
};

// Register budgets of the roles (setmaxnreg). setmaxnreg moves registers within what the block
// was launched with, 168 a thread under __launch_bounds__(384, 1) (65536 / 384 rounded down to a
// multiple of 8): the math warpgroups can grow only by what the producer gives back, and a larger
// sum waits forever. 40 / 232 rather than 24 / 240: ptxas spilled the producer's address
// arithmetic with 24 (29 spill instructions at D 64) and none of the math code needs more than 232.
inline constexpr int kFusedProducerRegisters = 40;
inline constexpr int kFusedMathRegisters = 232;
static_assert(128 * kFusedProducerRegisters + 256 * kFusedMathRegisters <= 168 * 384,
              "within the block's registers at launch");

// Named barrier ids of this kernel.
inline constexpr int kFusedDsBarrier = 1;
inline constexpr int kFusedDqFull = 2;   // and 3
inline constexpr int kFusedDqEmpty = 4;  // and 5
inline constexpr int kFusedMathThreads = 256;
inline constexpr int kFusedHandoffThreads = 128 + 32;

// Tensor maps of a fused kernel's operands: K and V in key tiles of KTile (kN keys), Q and
// dO in query tiles of QTile (kM queries). False where a map does not describe a tensor.
template <typename KTile, typename QTile>
inline bool encode_fused_maps(FusedBackwardMaps* maps, const BackwardParams& p, int kN, int kM) {
  const ForwardParams& f = p.fwd;
  return encode_kv_maps<KTile>(&maps->k, &maps->v, f, kN) &&
         encode_rows_map(&maps->q, f.q, f.head_dim, f.seqlen_q, f.heads, f.batch, f.q_row_stride,
                         f.q_head_stride, f.q_batch_stride, QTile::kBlockCols, kM,
                         QTile::kSwizzleBytes) &&
         encode_rows_map(&maps->dout, p.dout, f.value_dim, f.seqlen_q, f.heads, f.batch,
                         p.dout_row_stride, p.dout_head_stride, p.dout_batch_stride,
                         QTile::kBlockCols, kM, QTile::kSwizzleBytes);
}

// Thread 0 sets up the D 256 fused kernel's barriers (the block barrier after it publishes them):
// K / V's and each stage's dO `full` on one arrival (the producer's, with the bytes), each stage's
// Q `full` on the 32 lanes of the copying warp (each after its statistics' stores), each stage's
// `empty` on every math thread's.
__device__ __forceinline__ void init_fused_barriers(FusedBackwardBarriers* bars) {
  barrier_init(&bars->kv_full, 1);
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    barrier_init(&bars->q_full[s], 32);
    barrier_init(&bars->do_full[s], 1);
    barrier_init(&bars->empty[s], kFusedMathThreads);
  }
  ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
}

// Deterministic mode's turns (above): the writer's wait until `counter` reaches `turn` (acquire:
// the earlier blocks' adds, completed before their increments, are visible to this block's
// reductions, which the proxy fence orders after the wait), and its increment once its own adds
// have completed.
__device__ __forceinline__ void wait_for_turn(const int* counter, int turn) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen != turn);
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
__device__ __forceinline__ void pass_turn(int* counter) {
  ::cuda::ptx::cp_async_bulk_wait_group(::cuda::ptx::n32_t<0>{});
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// Whether a window has a right bound (causal and sliding windows; not a window open to the right,
// nor no mask at all).
template <typename Mask>
__device__ __forceinline__ bool window_bounded_right(const ForwardParams& f) {
  if constexpr (std::is_same_v<Mask, MaskWindow>) {
    return f.window_right != kUnboundedWindow;
  } else {
    return false;
  }
}

// The query tiles a key block walks: aligned to whole tiles (the accumulator's tiles), covering
// the queries its mask lets see any of its keys.
struct FusedQueryTiles {
  std::int64_t first_m0;
  int count;
};
template <int kM, typename Mask>
__device__ __forceinline__ FusedQueryTiles fused_query_tiles(const Mask& mask, std::int64_t n0,
                                                             int valid_keys,
                                                             std::int64_t num_queries) {
  const QueryRange range = query_range(mask, n0, n0 + valid_keys - 1, num_queries);
  if (range.end <= range.begin) return {0, 0};
  const std::int64_t first = range.begin / kM * kM;
  return {first, static_cast<int>((range.end - first + kM - 1) / kM)};
}

template <typename T, int kD, typename Policy>
__global__ void __launch_bounds__(kBwdFusedThreads, 1)
    backward_fused_kernel(const __grid_constant__ BackwardParams p,
                          const __grid_constant__ FusedBackwardMaps maps) {
  using Smem = FusedBackwardSmem<kD>;
  using KTile = typename Smem::KTile;
  using QTile = typename Smem::QTile;
  using DsTile = typename Smem::DsTile;
  using Accum = DqAccumulator<kD>;
  using Mask = typename Policy::Mask;
  using Scores = typename Policy::template Scores<T>;
  constexpr bool kSoftcap = std::is_same_v<Scores, ScoreSoftcap<T>>;
  static_assert((std::is_same_v<Scores, ScoreScale> || kSoftcap) && !Mask::kTokenTiles,
                "the plain, window and softcap policies");
  constexpr int kN = Smem::kN, kM = Smem::kM, kStages = Smem::kStages;
  constexpr int kScoreTiles = kM / 8, kOutTiles = kD / 8;
  const ForwardParams& f = p.fwd;

  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  const std::uint32_t base = (tile::shared_address(smem_raw) + 1023u) & ~1023u;
  std::uint8_t* const base_ptr = smem_raw + (base - tile::shared_address(smem_raw));
  auto* const bars = reinterpret_cast<FusedBackwardBarriers*>(base_ptr + Smem::kBarriers);

  const BlockCoords coords = block_coords<false>(f);
  const std::int64_t b = coords.batch;
  const int hk = coords.head;
  const bool ordered = p.dq_semaphore != nullptr;
  // Deterministic mode under windows with a right bound (causal): the key blocks add in
  // descending order, and the grid runs them from the last (above).
  const bool descending = ordered && window_bounded_right<Mask>(f);
  const std::int64_t key_block = descending ? coords.tiles - 1 - coords.tile : coords.tile;
  const std::int64_t n0 = key_block * kN;
  const SequenceRows rows = sequence_rows(f, b);
  if (n0 >= rows.num_keys) return;  // varlen: a shorter sequence (the whole block, no barrier yet)
  const int valid_keys = static_cast<int>(rows.num_keys - n0 < kN ? rows.num_keys - n0 : kN);
  const Mask mask = Mask::make(f, rows.num_queries, rows.num_keys);
  const FusedQueryTiles tiles = fused_query_tiles<kM>(mask, n0, valid_keys, rows.num_queries);
  const int num_steps = tiles.count * f.kv_group;
  const bool varlen = f.cu_seqlens_q != nullptr;

  // init_fused_barriers' setup written out: through the helper this kernel compiles to other
  // (equivalent) instructions than the ones the GPU suite and the benchmarks of 2026-11-27/28 ran.
  if (threadIdx.x == 0) {
    barrier_init(&bars->kv_full, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      barrier_init(&bars->q_full[s], 1);  // the copying thread's arrival with the bytes
      barrier_init(&bars->do_full[s], 1);
      barrier_init(&bars->empty[s], kFusedMathThreads);
    }
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  __syncthreads();

  const int warpgroup = warpgroup_index();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kFusedProducerRegisters));
    const int warp = static_cast<int>(threadIdx.x) / 32;
    if (warp == 0) {
      // Producer: K and V once, then each step's stage.
      if (lane == 0) {
        barrier_arrive_expect_bytes(&bars->kv_full, 2 * KTile::kBytes);
        tma_load_tile<KTile>(base_ptr + Smem::kK, maps.k, rows.k_start + n0, hk, b, &bars->kv_full);
        tma_load_tile<KTile>(base_ptr + Smem::kV, maps.v, rows.k_start + n0, hk, b, &bars->kv_full);
      }
      int head = hk * f.kv_group, m_tile = 0;
      for (int u = 0; u < num_steps && lane == 0; ++u) {
        const int s = u % kStages;
        const std::int64_t m0 = tiles.first_m0 + static_cast<std::int64_t>(m_tile) * kM;
        if (u >= kStages) barrier_wait(&bars->empty[s], ((u / kStages) + 1) & 1);
        // The tile's rows of lse and Delta too, by bulk copies: the launch padded a head's
        // statistics to whole query tiles (stat_rows), 16-byte aligned.
        const std::int64_t stat =
            b * p.stat_batch_stride + head * p.stat_head_stride + rows.q_start + m0;
        barrier_arrive_expect_bytes(&bars->q_full[s], QTile::kBytes + kM * 4);
        tma_load_tile<QTile>(base_ptr + Smem::kQ + s * QTile::kBytes, maps.q, rows.q_start + m0,
                             head, b, &bars->q_full[s]);
        copy_floats_bulk(base_ptr + Smem::kLse + s * kM * 4, p.lse_log2 + stat, kM,
                         &bars->q_full[s]);
        barrier_arrive_expect_bytes(&bars->do_full[s], QTile::kBytes + kM * 4);
        tma_load_tile<QTile>(base_ptr + Smem::kDout + s * QTile::kBytes, maps.dout,
                             rows.q_start + m0, head, b, &bars->do_full[s]);
        copy_floats_bulk(base_ptr + Smem::kDelta + s * kM * 4, p.delta + stat, kM,
                         &bars->do_full[s]);
        if (++m_tile == tiles.count) m_tile = 0, ++head;
      }
    } else if (warp == 1) {
      // dQ writer: each step's two staged chunks added to the accumulator's tile.
      if (num_steps > 0) {
        named_barrier_arrive<kFusedDqEmpty, kFusedHandoffThreads>();
        named_barrier_arrive<kFusedDqEmpty + 1, kFusedHandoffThreads>();
      }
      const float* const staging = reinterpret_cast<const float*>(base_ptr + Smem::kStaging);
      const std::int64_t first_row = Accum::padded_first_row(rows.q_start, b, varlen);
      int head = hk * f.kv_group, m_tile = 0;
      for (int u = 0; u < num_steps; ++u) {
        const std::int64_t m0 = tiles.first_m0 + static_cast<std::int64_t>(m_tile) * kM;
        float* const accum = p.dq_accum + b * p.accum_batch_stride + head * p.accum_head_stride +
                             (first_row + m0) * kD;
        int* const turn_counter = p.dq_semaphore != nullptr
                                      ? p.dq_semaphore + (accum - p.dq_accum) / Accum::kTileFloats
                                      : nullptr;
        named_barrier_sync<kFusedDqFull, kFusedHandoffThreads>();
        if (lane == 0) {
          if (turn_counter != nullptr) {
            // The tile's real rows only: under a window open to the right, rows past
            // num_queries would reach key blocks that no real row reaches, so none of them
            // would ever take its turn (every block's walk is clipped to num_queries).
            const std::int64_t last_row =
                (m0 + kM < rows.num_queries ? m0 + kM : rows.num_queries) - 1;
            const KeyRange keys = mask.key_range(m0, last_row);
            wait_for_turn(turn_counter,
                          static_cast<int>(descending ? (keys.end - 1) / kN - key_block
                                                      : key_block - keys.begin / kN));
          }
          ::cuda::ptx::cp_reduce_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared,
                                            ::cuda::ptx::op_add, accum, staging,
                                            static_cast<std::uint32_t>(Smem::kStagingBytes));
          ::cuda::ptx::cp_async_bulk_commit_group();
        }
        named_barrier_sync<kFusedDqFull + 1, kFusedHandoffThreads>();
        if (lane == 0) {
          ::cuda::ptx::cp_reduce_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared,
                                            ::cuda::ptx::op_add, accum + Accum::kChunkFloats,
                                            staging + Accum::kChunkFloats,
                                            static_cast<std::uint32_t>(Smem::kStagingBytes));
          ::cuda::ptx::cp_async_bulk_commit_group();
          ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<0>{});
        }
        __syncwarp();
        if (u + 1 < num_steps) {
          named_barrier_arrive<kFusedDqEmpty, kFusedHandoffThreads>();
          named_barrier_arrive<kFusedDqEmpty + 1, kFusedHandoffThreads>();
        }
        if (turn_counter != nullptr && lane == 0) pass_turn(turn_counter);
        if (++m_tile == tiles.count) m_tile = 0, ++head;
      }
      // The block's shared memory must outlive the reductions' reads, and its work their adds.
      if (lane == 0) ::cuda::ptx::cp_async_bulk_wait_group(::cuda::ptx::n32_t<0>{});
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kFusedMathRegisters));
  const int mw = warpgroup - 1;  // math warpgroup: keys [64 mw, +64) of the block
  const int thread = static_cast<int>(threadIdx.x) % 128;
  const int warp = thread / 32;  // within the warpgroup: rows [16 warp, +16) of its 64
  const int first_key_row = 64 * mw;
  const std::int64_t key_row = n0 + first_key_row + warp * 16 + lane / 4;
  const int fragment_col = 2 * (lane % 4);
  const std::uint32_t smem_k = base + Smem::kK, smem_v = base + Smem::kV;
  auto smem_q = [&](int s) { return base + Smem::kQ + s * QTile::kBytes; };
  auto smem_do = [&](int s) { return base + Smem::kDout + s * QTile::kBytes; };
  auto smem_ds = [&](int s) { return base + Smem::kDs + s * DsTile::kBytes; };
  const float* const stats = reinterpret_cast<const float*>(base_ptr + Smem::kLse);
  float4* const staging =
      reinterpret_cast<float4*>(base_ptr + Smem::kStaging + mw * Smem::kStagingBytes);

  // Every accumulator lives across the loop, zeroed once: a product's registers defined by other
  // instructions between the fence and the wgmma make ptxas insert warpgroup.arrive (C7519).
  float dk[kOutTiles][4], dv[kOutTiles][4];
  float st[kScoreTiles][4], dp[kScoreTiles][4], dq[8][4];
  zero_accumulators(dk);
  zero_accumulators(dv);
  zero_accumulators(st);
  zero_accumulators(dp);
  zero_accumulators(dq);
  barrier_wait(&bars->kv_full, 0);

  int m_tile = 0;
  for (int u = 0; u < num_steps; ++u) {
    const int s = u % kStages;
    const int parity = (u / kStages) & 1;
    const std::int64_t m0 = tiles.first_m0 + static_cast<std::int64_t>(m_tile) * kM;
    if (++m_tile == tiles.count) m_tile = 0;

    barrier_wait(&bars->q_full[s], parity);
    wgmma_fence();
    ss_product<T, kD / 16, KTile, QTile>(st, smem_k, first_key_row, smem_q(s));
    wgmma_commit();
    barrier_wait(&bars->do_full[s], parity);
    wgmma_fence();  // the wait's branch ends the run of wgmma for ptxas
    ss_product<T, kD / 16, KTile, QTile>(dp, smem_v, first_key_row, smem_do(s));
    wgmma_commit();

    wgmma_wait<1>();
    fence_accumulators(st);
    const bool full =
        m0 + kM <= rows.num_queries && mask.tile_is_full(m0, m0 + kM - 1, n0 + first_key_row, 64);
    // Softcap: the scores' tanh under dP^T, the probabilities after it (softcap_tanh_tiles).
    if constexpr (kSoftcap) {
      softcap_tanh_tiles(Scores::make(f, b, hk, rows.num_queries, rows.num_keys), st);
    }
    if (!full) hide_invisible_transposed(mask, st, key_row, m0 + fragment_col, rows.num_queries);
    const float* lse = stats + s * kM;
    const float* delta = stats + (kStages + s) * kM;
    if constexpr (!kSoftcap) {
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) {
        const float2 l = *reinterpret_cast<const float2*>(lse + t * 8 + fragment_col);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          st[t][e] = exp2_ftz(fmaf(st[t][e], f.scale_log2, -((e & 1) ? l.y : l.x)));
        }
      }
    }
    wgmma_wait<0>();
    fence_accumulators(dp);
    if constexpr (kSoftcap) {
      softcap_probs_and_grads_transposed(Scores::make(f, b, hk, rows.num_queries, rows.num_keys),
                                         st, dp, lse, delta, fragment_col);
    } else {
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) {
        const float2 d = *reinterpret_cast<const float2*>(delta + t * 8 + fragment_col);
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[t][e] = st[t][e] * (dp[t][e] - ((e & 1) ? d.y : d.x));
      }
    }

    std::uint32_t pa[kM / 16][4], da[kM / 16][4];
    pack_fragments<T>(st, pa);
    pack_fragments<T>(dp, da);
    fence_fragments(pa);
    fence_fragments(da);
    fence_accumulators(dv);
    wgmma_fence();
    rs_product<T, kM / 16, QTile>(dv, pa, smem_do(s));
    wgmma_commit();

    // dS^T of this warpgroup's keys for both warpgroups' dQ products.
    store_fragments_stmatrix<DsTile>(smem_ds(u % 2), first_key_row + warp * 16, da, lane);
    fence_proxy_async();
    named_barrier_sync<kFusedDsBarrier, kFusedMathThreads>();

    fence_accumulators(dk);
    wgmma_fence();
    if constexpr (Accum::kSplitColumns) {  // all queries x head-dim columns [64 mw, +64)
      mn_product<T, kN / 16, DsTile, SwizzledTile<kN, 64>>(dq, smem_ds(u % 2), 0,
                                                           smem_k + mw * KTile::kBlockBytes, 0);
    } else {  // queries [64 mw, +64) x all 64 columns
      mn_product<T, kN / 16, DsTile, KTile>(dq, smem_ds(u % 2), 64 * mw, smem_k, 0);
    }
    wgmma_commit();
    rs_product<T, kM / 16, QTile>(dk, da, smem_q(s));
    wgmma_commit();

    wgmma_wait<1>();  // dV and dQ
    fence_accumulators(dq);
    fence_fragments(pa);  // read by dV until here
    if (mw == 0) {
      named_barrier_sync<kFusedDqEmpty, kFusedHandoffThreads>();
    } else {
      named_barrier_sync<kFusedDqEmpty + 1, kFusedHandoffThreads>();
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      staging[j * 128 + thread] = make_float4(dq[j][0], dq[j][1], dq[j][2], dq[j][3]);
    }
    fence_proxy_async();
    if (mw == 0) {
      named_barrier_arrive<kFusedDqFull, kFusedHandoffThreads>();
    } else {
      named_barrier_arrive<kFusedDqFull + 1, kFusedHandoffThreads>();
    }
    wgmma_wait<0>();  // dK
    fence_accumulators(dk);
    fence_accumulators(dv);
    fence_fragments(da);  // read by dK until here
    // Every thread's own arrival: each has read the stage's lse and Delta rows.
    barrier_arrive(&bars->empty[s]);
  }

  // Epilogue: dk = scale * dK and dv staged in this warp's own rows of the K and V tiles once
  // both warpgroups' last products (dQ reads all of K) are done, then stored 16 bytes at a time.
  named_barrier_sync<kFusedDsBarrier, kFusedMathThreads>();
  using Convert = tile::Dtype<T>;
#pragma unroll
  for (int t = 0; t < kOutTiles; ++t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = first_key_row + warp * 16 + lane / 4 + 8 * r;
      const std::uint32_t offset = KTile::chunk_offset(row, t) + fragment_col * 2;
      const std::uint32_t k_packed =
          Convert::pack(dk[t][2 * r] * p.scale, dk[t][2 * r + 1] * p.scale);
      const std::uint32_t v_packed = Convert::pack(dv[t][2 * r], dv[t][2 * r + 1]);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_k + offset), "r"(k_packed) : "memory");
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_v + offset), "r"(v_packed) : "memory");
    }
  }
  __syncwarp();
  const int first_row = first_key_row + warp * 16;
  const int warp_keys = valid_keys - first_row;
  const std::int64_t key = rows.k_start + n0 + first_row;
  store_tile_rows<kD>(base_ptr + Smem::kK, KTile{}, first_row, warp_keys,
                      static_cast<std::uint16_t*>(p.dk) + b * p.dk_batch_stride +
                          key * p.dk_row_stride + hk * p.dk_head_stride,
                      p.dk_row_stride, f.head_dim, lane);
  store_tile_rows<kD>(base_ptr + Smem::kV, KTile{}, first_row, warp_keys,
                      static_cast<std::uint16_t*>(p.dv) + b * p.dv_batch_stride +
                          key * p.dv_row_stride + hk * p.dv_head_stride,
                      p.dv_row_stride, f.value_dim, lane);
}

}  // namespace fmha::cuda::sm90
