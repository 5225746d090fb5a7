// The warp-specialized fused backward at head-dim bucket 256 (sm_90a only), launched by the fused
// form's dK/dV launch (launch_bwd.cuh) for dense plain / window problems, and without its dQ part
// as the split form's dK/dV kernel for those and (dispatch_bwd.cu) for softcap alone.
//
// At D 256 the D 64 / 128 kernel's layout (mainloop_bwd_fused.cuh: keys on the M of every product,
// dK and dV of 64 keys a warpgroup in registers) would need 256 accumulator registers a thread for
// dK and dV alone. So here, as in FlashAttention-3's D 256 backward, dK and dV are accumulated
// transposed, with the head dim on M: a block owns kN = 64 keys of one (batch, kv head) and walks
// 64-query tiles of every query head of the group; math warpgroup w holds head-dim rows
// [128 w, +128) of dK^T and dV^T (two m64 products each, 64 + 64 floats a thread). A step:
//   S  = Q K^T, dP = dO V^T            (queries on M; warpgroup w takes keys [32 w, +32), or,
//                                       under the plain policy, S on warpgroup 0 and dP on 1:
//                                       kSplitProducts)
//   P  = exp2(scale S - lse), dS = P (dP - Delta)   (row statistics: queries are rows here)
//   P, dS -> shared memory             (rows = queries, columns = keys; both warpgroups' halves)
//   dV^T += dO^T P, dK^T += Q^T dS     (A = dO, Q read MN-major; B = P, dS MN-major)
//   dQ^T  = K^T dS^T                   (A = K MN-major, B = dS K-major), in two m64 blocks, each
//                                       added to the by-column fp32 accumulator by float2 atomics
//                                       (fused_dq.cuh's layout and conversion kernel)
// Warp 0 of the producer warpgroup copies K and V once and each step's Q and dO tiles by TMA
// (2 stages) and their rows' lse and Delta with bounds (the statistics are not padded on this
// path); the other producer warps leave.
// Barriers: the stages' mbarriers as in mainloop_bwd_fused.cuh (q_full on the 32 lanes of the
// copying warp, each releasing its own statistics' stores), and two named barriers of the 256
// math threads: kD256Free (both warpgroups are done with the previous step's P and dS) and
// kD256Ready (this step's P and dS are stored); by product also kD256Factor (warpgroup 0 has
// stored P and dS's factor).
// Softcap alone (PolicySoftcap) turns S into tanh(scale S / softcap) under dP (softcap_tanh_tiles,
// before the mask hides entries), then forms P = exp2(softcap tanh - lse) and
// dS = P (dP - Delta) (1 - tanh^2) from it (softcap_probs_and_grads: backward_policies.cuh).
// Rows past the sequence keep lse = Delta = 0 and zero Q and dO: tanh 0 gives P = 1 there, but
// their dP is 0, so dS and their P dO terms vanish as without softcap.
#pragma once

#include <cstdint>
#include <cuda/ptx>
#include <type_traits>

#include "cuda/common/backward_params.h"
#include "cuda/common/backward_policies.cuh"
#include "cuda/common/block_coords.cuh"
#include "cuda/common/mask_policies.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm90/fused_dq.cuh"
#include "cuda/sm90/mainloop_bwd_fused.cuh"
#include "cuda/sm90/tile_copies.cuh"
#include "cuda/sm90/tiles.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace fmha::cuda::sm90 {

// Shared memory of a block, from a 1024-byte aligned base: K, V, two stages of Q and dO, P and dS,
// dS's factor in fp32, the statistics of the two stages, the barriers (about 225 KB).
struct FusedD256Smem {
  static constexpr int kD = 256, kN = 64, kM = 64, kStages = 2;
  using KTile = SwizzledTile<kN, kD>;  // K and V: rows = keys
  using QTile = SwizzledTile<kM, kD>;  // Q and dO: rows = queries
  using PTile = SwizzledTile<kM, kN>;  // P and dS: rows = queries, columns = keys
  static constexpr int kK = 0;
  static constexpr int kV = kK + KTile::kBytes;
  static constexpr int kQ = kV + KTile::kBytes;
  static constexpr int kDout = kQ + kStages * QTile::kBytes;
  static constexpr int kP = kDout + kStages * QTile::kBytes;
  static constexpr int kDs = kP + PTile::kBytes;
  static constexpr int kFactor = kDs + PTile::kBytes;  // fp32, one row of 32 floats a thread
  static constexpr int kLse = kFactor + kM * kN * 4;
  static constexpr int kDelta = kLse + kStages * kM * 4;
  static constexpr int kBarriers = kDelta + kStages * kM * 4;
  static constexpr int kBytes = kBarriers + static_cast<int>(sizeof(FusedBackwardBarriers));
  static constexpr int kLaunchBytes = kBytes + 1024;  // the base rounded up to 1024 bytes
  static_assert(kLaunchBytes <= 227 * 1024, "fits an sm90 block");
};

inline constexpr int kD256Free = 1;  // named barrier ids of this kernel
inline constexpr int kD256Ready = 2;
inline constexpr int kD256Factor = 3;

// kWithDq false: dK and dV only (no dQ^T products, no adds), the dK/dV kernel of the split form,
// whose dQ kernel runs after it; p.dq_accum is not read.
template <typename T, typename Policy, bool kWithDq = true>
__global__ void __launch_bounds__(kBwdFusedThreads, 1)
    backward_fused_d256_kernel(const __grid_constant__ BackwardParams p,
                               const __grid_constant__ FusedBackwardMaps maps) {
  using Smem = FusedD256Smem;
  using KTile = Smem::KTile;
  using QTile = Smem::QTile;
  using PTile = Smem::PTile;
  using Mask = typename Policy::Mask;
  using Scores = typename Policy::template Scores<T>;
  constexpr bool kSoftcap = std::is_same_v<Scores, ScoreSoftcap<T>>;
  static_assert((std::is_same_v<Scores, ScoreScale> || kSoftcap) && !Mask::kTokenTiles,
                "the plain, window and softcap policies");
  constexpr int kD = Smem::kD, kN = Smem::kN, kM = Smem::kM, kStages = Smem::kStages;
  constexpr int kHalfKeys = kN / 2;  // S and dP columns of a math warpgroup (kSplitProducts false)
  // Whether the step's S and dP split by product (S on math warpgroup 0, dP on 1, each over all
  // kN keys; warpgroup 0 then hands P's factor in dS = factor (dP - Delta) to warpgroup 1 through
  // shared memory) rather than by keys (each warpgroup S and dP of kN / 2 keys). By product each
  // A operand (Q, dO) is read once a step instead of twice, a third less of the shared-memory
  // traffic of S and dP, which bound the kernel (Nsight Compute, H200, L 4096: shared memory 86%
  // busy, tensor pipe 56%; S and dP 56% of the wavefronts); but warpgroup 1's dS waits for
  // warpgroup 0's exponentials of the whole tile. Measured on an H200 (2026-11-29, kernel alone,
  // the split form's dK/dV, bf16, 16k tokens, 8 heads): plain L 4096 2.01 -> 1.84 ms, L 16384
  // 8.34 -> 7.76; but causal L 4096 1.07 -> 1.11, L 8192 2.01 -> 2.07, hence the plain policy.
  constexpr bool kSplitProducts = std::is_same_v<Policy, PolicyPlain>;
  const ForwardParams& f = p.fwd;

  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  const std::uint32_t base = (tile::shared_address(smem_raw) + 1023u) & ~1023u;
  std::uint8_t* const base_ptr = smem_raw + (base - tile::shared_address(smem_raw));
  auto* const bars = reinterpret_cast<FusedBackwardBarriers*>(base_ptr + Smem::kBarriers);
  float* const lse_smem = reinterpret_cast<float*>(base_ptr + Smem::kLse);
  float* const delta_smem = reinterpret_cast<float*>(base_ptr + Smem::kDelta);

  const BlockCoords coords = block_coords<false>(f);
  const std::int64_t b = coords.batch;
  const int hk = coords.head;
  const std::int64_t n0 = coords.tile * kN;
  const SequenceRows rows = sequence_rows(f, b);
  if (n0 >= rows.num_keys) return;  // the whole block, before any barrier
  const int valid_keys = static_cast<int>(rows.num_keys - n0 < kN ? rows.num_keys - n0 : kN);
  const Mask mask = Mask::make(f, rows.num_queries, rows.num_keys);
  const FusedQueryTiles tiles = fused_query_tiles<kM>(mask, n0, valid_keys, rows.num_queries);
  const int num_steps = tiles.count * f.kv_group;
  const int first_tile = tiles.count > 0 ? static_cast<int>(coords.tile % tiles.count) : 0;

  static_assert(kStages == 2, "the barriers' stages");
  if (threadIdx.x == 0) init_fused_barriers(bars);
  __syncthreads();

  const int warpgroup = warpgroup_index();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kFusedProducerRegisters));
    if (threadIdx.x / 32 != 0) return;
    if (lane == 0) {
      barrier_arrive_expect_bytes(&bars->kv_full, 2 * KTile::kBytes);
      tma_load_tile<KTile>(base_ptr + Smem::kK, maps.k, rows.k_start + n0, hk, b, &bars->kv_full);
      tma_load_tile<KTile>(base_ptr + Smem::kV, maps.v, rows.k_start + n0, hk, b, &bars->kv_full);
    }
    QueryWalk walk{hk * f.kv_group, first_tile, 0};
    for (int u = 0; u < num_steps; ++u) {
      const int s = u % kStages;
      const int head = walk.head;
      const std::int64_t m0 = tiles.first_m0 + static_cast<std::int64_t>(walk.m_tile) * kM;
      if (u >= kStages) barrier_wait(&bars->empty[s], ((u / kStages) + 1) & 1);
      // The rows' lse and Delta (0 past the sequence: those rows' Q and dO are zeros, so their
      // P dO and dS vanish whatever P is).
      const std::int64_t stat = b * p.stat_batch_stride + head * p.stat_head_stride + rows.q_start;
      for (int i = lane; i < kM; i += 32) {
        const bool inside = m0 + i < rows.num_queries;
        lse_smem[s * kM + i] = inside ? p.lse_log2[stat + m0 + i] : 0.0f;
        delta_smem[s * kM + i] = inside ? p.delta[stat + m0 + i] : 0.0f;
      }
      // Each lane's arrival releases its own stores (lane 0's also brings Q's bytes).
      if (lane == 0) {
        barrier_arrive_expect_bytes(&bars->q_full[s], QTile::kBytes);
        tma_load_tile<QTile>(base_ptr + Smem::kQ + s * QTile::kBytes, maps.q, rows.q_start + m0,
                             head, b, &bars->q_full[s]);
        barrier_arrive_expect_bytes(&bars->do_full[s], QTile::kBytes);
        tma_load_tile<QTile>(base_ptr + Smem::kDout + s * QTile::kBytes, maps.dout,
                             rows.q_start + m0, head, b, &bars->do_full[s]);
      } else {
        barrier_arrive(&bars->q_full[s]);
      }
      walk.advance(tiles.count);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kFusedMathRegisters));
  const int mw = warpgroup - 1;
  const int warp = (static_cast<int>(threadIdx.x) % 128) / 32;  // within the warpgroup
  const int fragment_col = 2 * (lane % 4);
  const int first_dim = 128 * mw;        // dK^T, dV^T, dQ^T: head-dim rows [128 mw, +128)
  const int first_key = kHalfKeys * mw;  // by keys: S and dP of keys [32 mw, +32) of the block
  const std::uint32_t smem_k = base + Smem::kK, smem_v = base + Smem::kV;
  const std::uint32_t smem_p = base + Smem::kP, smem_ds = base + Smem::kDs;
  auto smem_q = [&](int s) { return base + Smem::kQ + s * QTile::kBytes; };
  auto smem_do = [&](int s) { return base + Smem::kDout + s * QTile::kBytes; };
  // dS's factor, from warpgroup 0's thread to warpgroup 1's thread of the same index, whose dP
  // entries are the same (row, key) pairs: float4 t of thread i at [t][i], 16 bytes apart.
  float4* const factor_smem = reinterpret_cast<float4*>(base_ptr + Smem::kFactor);
  const int wg_thread = static_cast<int>(threadIdx.x) % 128;
  auto store_factor = [&](const float (&x)[kN / 8][4]) {
#pragma unroll
    for (int t = 0; t < kN / 8; ++t) {
      factor_smem[t * 128 + wg_thread] = make_float4(x[t][0], x[t][1], x[t][2], x[t][3]);
    }
  };
  auto load_factor = [&](float (&x)[kN / 8][4]) {
#pragma unroll
    for (int t = 0; t < kN / 8; ++t) {
      const float4 v = factor_smem[t * 128 + wg_thread];
      x[t][0] = v.x;
      x[t][1] = v.y;
      x[t][2] = v.z;
      x[t][3] = v.w;
    }
  };

  // Every accumulator lives across the loop, zeroed once (mainloop_bwd_fused.cuh says why).
  float dk[2][kN / 8][4], dv[2][kN / 8][4];
  // By keys: s and dp; by product: sp, S on warpgroup 0 and dP on warpgroup 1.
  float s[kHalfKeys / 8][4], dp[kHalfKeys / 8][4], sp[kN / 8][4], dq[kM / 8][4];
  zero_accumulators(dk[0]);
  zero_accumulators(dk[1]);
  zero_accumulators(dv[0]);
  zero_accumulators(dv[1]);
  zero_accumulators(s);
  zero_accumulators(dp);
  zero_accumulators(sp);
  zero_accumulators(dq);
  barrier_wait(&bars->kv_full, 0);

  QueryWalk walk{hk * f.kv_group, first_tile, 0};
  for (int u = 0; u < num_steps; ++u) {
    const int st = u % kStages;
    const int parity = (u / kStages) & 1;
    const std::int64_t m0 = tiles.first_m0 + static_cast<std::int64_t>(walk.m_tile) * kM;
    const int h = walk.head;
    walk.advance(tiles.count);

    if constexpr (kSplitProducts) {
      // S on warpgroup 0, dP on warpgroup 1, each over all kN keys: one product a warpgroup reads
      // its A operand (Q or dO) once, where two products of kN / 2 keys each read both.
      const bool scores_part = mw == 0;
      const int r0 = warp * 16 + lane / 4;  // this thread's rows r0 and r0 + 8 of the tile
      if (scores_part) {
        barrier_wait(&bars->q_full[st], parity);
      } else {
        barrier_wait(&bars->do_full[st], parity);
      }
      wgmma_fence();  // the wait's branch ends the run of wgmma for ptxas
      ss_product<T, kD / 16, QTile, KTile>(sp, scores_part ? smem_q(st) : smem_do(st), 0,
                                           scores_part ? smem_k : smem_v);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(sp);

      if (scores_part) {
        // P = exp2(scale S - lse) (softcap: S's tanh under the mask, then P from it), and the
        // factor of dS = factor (dP - Delta): P, or P (1 - tanh^2) clamped at 0 under softcap.
        if constexpr (kSoftcap) {
          softcap_tanh_tiles(Scores::make(f, b, hk, rows.num_queries, rows.num_keys), sp);
        }
        if (!mask.tile_is_full(m0, m0 + kM - 1, n0, kN)) {
          hide_invisible(mask, sp, m0 + r0, n0 + fragment_col);
        }
        const float* const lse = lse_smem + st * kM;
        const float l0 = lse[r0], l8 = lse[r0 + 8];
        float factor[kN / 8][4];
#pragma unroll
        for (int t = 0; t < kN / 8; ++t) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if constexpr (kSoftcap) {
              const float tanh = sp[t][e];
              sp[t][e] = exp2_ftz(fmaf(tanh, f.softcap_log2, -(e < 2 ? l0 : l8)));
              factor[t][e] = sp[t][e] * fmaxf(fmaf(-tanh, tanh, 1.0f), 0.0f);
            } else {
              sp[t][e] = exp2_ftz(fmaf(sp[t][e], f.scale_log2, -(e < 2 ? l0 : l8)));
              factor[t][e] = sp[t][e];
            }
          }
        }
        std::uint32_t pa[kN / 16][4];
        pack_fragments<T>(sp, pa);
        // Once both warpgroups are done with the last step's P, dS and factor.
        named_barrier_sync<kD256Free, kFusedMathThreads>();
        store_fragments_stmatrix<PTile>(smem_p, warp * 16, pa, lane);
        store_factor(factor);
        fence_proxy_async();
        named_barrier_sync<kD256Factor, kFusedMathThreads>();
      } else {
        barrier_wait(&bars->q_full[st], parity);  // the stage's Delta is stored
        const float* const delta = delta_smem + st * kM;
        const float d0 = delta[r0], d8 = delta[r0 + 8];
        // Syncs where arrives would do (warpgroup 0 need not wait for warpgroup 1 at either):
        // compute-sanitizer's racecheck does not order accesses by a named barrier that one side
        // only arrives at (it reported the factor's store and load, and the epilogue's tiles);
        // warpgroup 1 gets to both before warpgroup 0 about always.
        named_barrier_sync<kD256Free, kFusedMathThreads>();
        named_barrier_sync<kD256Factor, kFusedMathThreads>();
        float factor[kN / 8][4];
        load_factor(factor);
#pragma unroll
        for (int t = 0; t < kN / 8; ++t) {
#pragma unroll
          for (int e = 0; e < 4; ++e) sp[t][e] = factor[t][e] * (sp[t][e] - (e < 2 ? d0 : d8));
        }
        std::uint32_t da[kN / 16][4];
        pack_fragments<T>(sp, da);
        store_fragments_stmatrix<PTile>(smem_ds, warp * 16, da, lane);
        fence_proxy_async();
      }
      named_barrier_sync<kD256Ready, kFusedMathThreads>();
    } else {
      barrier_wait(&bars->q_full[st], parity);
      wgmma_fence();
      ss_product<T, kD / 16, QTile, KTile>(s, smem_q(st), 0, smem_k, first_key);
      wgmma_commit();
      barrier_wait(&bars->do_full[st], parity);
      wgmma_fence();  // the wait's branch ends the run of wgmma for ptxas
      ss_product<T, kD / 16, QTile, KTile>(dp, smem_do(st), 0, smem_v, first_key);
      wgmma_commit();

      // P from S (rows = queries: this thread's rows r0 and r0 + 8 of the tile).
      const int r0 = warp * 16 + lane / 4;
      const float* const lse = lse_smem + st * kM;
      const float* const delta = delta_smem + st * kM;
      wgmma_wait<1>();
      fence_accumulators(s);
      // Softcap: the scores' tanh under dP, the probabilities after it.
      if constexpr (kSoftcap) {
        softcap_tanh_tiles(Scores::make(f, b, hk, rows.num_queries, rows.num_keys), s);
      }
      if (!mask.tile_is_full(m0, m0 + kM - 1, n0 + first_key, kHalfKeys)) {
        hide_invisible(mask, s, m0 + r0, n0 + first_key + fragment_col);
      }
      const float l0 = lse[r0], l8 = lse[r0 + 8];
      if constexpr (!kSoftcap) {
#pragma unroll
        for (int t = 0; t < kHalfKeys / 8; ++t) {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[t][e] = exp2_ftz(fmaf(s[t][e], f.scale_log2, -(e < 2 ? l0 : l8)));
        }
      }
      wgmma_wait<0>();
      fence_accumulators(dp);
      const float d0 = delta[r0], d8 = delta[r0 + 8];
      if constexpr (kSoftcap) {
        softcap_probs_and_grads(Scores::make(f, b, hk, rows.num_queries, rows.num_keys), s, dp, l0,
                                l8, d0, d8);
      } else {
#pragma unroll
        for (int t = 0; t < kHalfKeys / 8; ++t) {
#pragma unroll
          for (int e = 0; e < 4; ++e) dp[t][e] = s[t][e] * (dp[t][e] - (e < 2 ? d0 : d8));
        }
      }
      std::uint32_t pa[kHalfKeys / 16][4], da[kHalfKeys / 16][4];
      pack_fragments<T>(s, pa);
      pack_fragments<T>(dp, da);

      // P and dS of this warpgroup's keys, once both warpgroups are done with the last step's.
      named_barrier_sync<kD256Free, kFusedMathThreads>();
      store_fragments_stmatrix<PTile>(smem_p, warp * 16, pa, lane, first_key / 8);
      store_fragments_stmatrix<PTile>(smem_ds, warp * 16, da, lane, first_key / 8);
      fence_proxy_async();
      named_barrier_sync<kD256Ready, kFusedMathThreads>();
    }

    // dQ^T's first block, then dV^T and dK^T; the first block's adds run under the latter.
    if constexpr (kWithDq) {
      wgmma_fence();
      mk_product<T, kN / 16, KTile, PTile>(dq, smem_k, first_dim, smem_ds, 0);
      wgmma_commit();
    }
    fence_accumulators(dv[0]);
    fence_accumulators(dv[1]);
    fence_accumulators(dk[0]);
    fence_accumulators(dk[1]);
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      mn_product<T, kM / 16, QTile, PTile>(dv[c], smem_do(st), first_dim + 64 * c, smem_p, 0, true);
    }
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      mn_product<T, kM / 16, QTile, PTile>(dk[c], smem_q(st), first_dim + 64 * c, smem_ds, 0, true);
    }
    wgmma_commit();

    if constexpr (kWithDq) {
      const std::int64_t first_query = rows.q_start + m0;
      float* const accum =
          p.dq_accum + b * p.accum_batch_stride + h * p.accum_head_stride + first_query;
      const int valid_queries =
          static_cast<int>(rows.num_queries - m0 < kM ? rows.num_queries - m0 : kM);
      const bool pairs = (reinterpret_cast<std::uintptr_t>(accum) & 7) == 0;
      wgmma_wait<1>();
      fence_accumulators(dq);
      add_dq_block(dq, accum, p.accum_col_stride, first_dim, warp, lane, f.head_dim, valid_queries,
                   pairs);
      wgmma_fence();
      mk_product<T, kN / 16, KTile, PTile>(dq, smem_k, first_dim + 64, smem_ds, 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(dq);
      fence_accumulators(dv[0]);
      fence_accumulators(dv[1]);
      fence_accumulators(dk[0]);
      fence_accumulators(dk[1]);
      add_dq_block(dq, accum, p.accum_col_stride, first_dim + 64, warp, lane, f.head_dim,
                   valid_queries, pairs);
    } else {
      wgmma_wait<0>();
      fence_accumulators(dv[0]);
      fence_accumulators(dv[1]);
      fence_accumulators(dk[0]);
      fence_accumulators(dk[1]);
    }
    // Every math thread's own arrival: it has read the stage's statistics and its products are
    // done with the stage's Q and dO.
    barrier_arrive(&bars->empty[st]);
  }

  // Epilogue: dk = scale * dK and dv, transposed into the K and V tiles (rows = keys) once both
  // warpgroups' products are done with them, then stored 16 bytes at a time: warpgroup 0 dk's
  // rows, warpgroup 1 dv's, a warp 16 rows.
  named_barrier_sync<kD256Free, kFusedMathThreads>();
  using Convert = tile::Dtype<T>;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
#pragma unroll
    for (int t = 0; t < kN / 8; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int dim = first_dim + 64 * c + warp * 16 + lane / 4 + 8 * (e / 2);
        const int key = t * 8 + fragment_col + (e & 1);
        const std::uint32_t offset = KTile::chunk_offset(key, dim / 8) + (dim % 8) * 2;
        const std::uint16_t k_bits = Convert::from_float(dk[c][t][e] * p.scale);
        const std::uint16_t v_bits = Convert::from_float(dv[c][t][e]);
        asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(smem_k + offset), "h"(k_bits) : "memory");
        asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(smem_v + offset), "h"(v_bits) : "memory");
      }
    }
  }
  named_barrier_sync<kD256Ready, kFusedMathThreads>();
  const int first_row = warp * 16;
  const int warp_keys = valid_keys - first_row;
  const std::int64_t key = rows.k_start + n0 + first_row;
  if (mw == 0) {
    store_tile_rows<kD>(base_ptr + Smem::kK, KTile{}, first_row, warp_keys,
                        static_cast<std::uint16_t*>(p.dk) + b * p.dk_batch_stride +
                            key * p.dk_row_stride + hk * p.dk_head_stride,
                        p.dk_row_stride, f.head_dim, lane);
  } else {
    store_tile_rows<kD>(base_ptr + Smem::kV, KTile{}, first_row, warp_keys,
                        static_cast<std::uint16_t*>(p.dv) + b * p.dv_batch_stride +
                            key * p.dv_row_stride + hk * p.dv_head_stride,
                        p.dv_row_stride, f.value_dim, lane);
  }
}

}  // namespace fmha::cuda::sm90
