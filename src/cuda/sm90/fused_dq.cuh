// The fused backward's dQ work inside the sm90 dK/dV kernel (backward_impl = fused; sm_90a only).
//
// Per query tile the dK/dV block already holds dS^T (rows = its keys) in registers as the A
// fragments of dK += dS^T Q. The fused kernel also stores them once to shared memory, in the
// swizzled layout with rows = keys, and computes dQ^T = K^T dS^T with both operands read
// M/N-major from the tiles as they lie (K as loaded, dS^T as stored: no transposes). The product
// leaves dQ^T in registers, rows = head-dim columns, so the accumulator in global memory is laid
// out by column, [head_dim][queries] per (batch, head): a sum tile row is a run of queries of one
// column, added by one bulk reduction. A conversion kernel writes dq = scale * dQ afterwards
// (backward_rows.cu). Where the bias is staged (D 64), dS^T takes the bias tile of its own stage
// (mainloop_bwd_dkdv.cuh): the two would not fit side by side.
//
// The M of a wgmma is 64 rows, so the two warpgroups split the product by head-dim bucket:
//   D  64: each warpgroup its own 64 keys (the keys of its dS^T rows, after a warpgroup barrier);
//          the two partial sums meet in a shared-memory tile, whose rows (one per head-dim
//          column) go to the accumulator as bulk reductions (cp.reduce.async.bulk: the copy
//          engine adds whole rows while the block goes on). They cost what per-thread atomics
//          cost, and plain bulk copies of the same rows as much again: the bytes bound the
//          kernel, not the adds (H100, 2026-11-24: 15% faster than split with no dQ traffic);
//   D 128: each warpgroup 64 head-dim rows over all 128 keys (after a block barrier: the other
//          warpgroup's dS^T rows), staged and added the same way, each warpgroup its own rows.
//   D 256: each warpgroup 128 head-dim rows (two products of 64) over all 128 keys, in the dK
//          part's kernel (the dV part's runs as in the split form). No sum tile fits beside its
//          tiles (40 KB): each thread adds its accumulators to the accumulator with float2
//          atomics (32 floats a thread a step), as FlashAttention-3 does at this head dim.
//          Level with the split form (H200, bf16, 2026-11-28, 16k tokens: 0.88-1.01x its speed),
//          so auto keeps split there too: the products it saves are not what bounds D 256.
// The split backward (a dQ kernel that recomputes S and dP) does 7 products a tile pair where this
// does 5, at the price of the reductions. Measured on an H100 (bf16, 2026-11-24) the reductions
// cost more than the two products: fused 1.00-1.24x the split time at D 64 / 128, L 512-8192,
// causal or not, and at SAM-B; so backward_impl = auto runs split on Hopper (backward.cu).
// At D 128 a bias cannot be staged beside the sum tile: the general policy reads it from global
// memory (B2 H16 L2048 D128: 2.8x the split time).
#pragma once

#include <cstdint>
#include <cuda/ptx>
#include <type_traits>

#include "cuda/common/forward_policies.cuh"
#include "cuda/sm90/tile_sizes_bwd.h"
#include "cuda/sm90/tiles.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace fmha::cuda::sm90 {

// The (bucket, policy) pairs with a fused kernel: range masks (token tiles gather their queries)
// and score modifiers whose gradients need no per-row sums (rel-pos's drel_h / drel_w are the
// split dQ kernel's). The dispatch's sm90_fused_backward_applies says the same at run time.
template <int kD, typename Policy>
constexpr bool sm90_fused_backward_instantiated() {
  return bwd_fused_bucket(kD) && !Policy::Mask::kTokenTiles &&
         !std::is_same_v<Policy, PolicyRelPos>;
}

// Whether a step's dS^T takes the bias tile of its own stage (mainloop_bwd_dkdv.cuh) instead of a
// tile of its own: wherever bias tiles are staged, i.e. always for the bias policy and, for the
// general one, when the launcher staged them (f.bias_staged). One rule for the launcher's shared
// memory and the kernel's addresses.
template <typename Policy>
__host__ __device__ constexpr bool ds_in_bias_tile(bool bias_staged) {
  return std::is_same_v<Policy, PolicyBias> ||
         (std::is_same_v<Policy, PolicyGeneral> && bias_staged);
}

// Adds one m64 block of dQ^T from a thread's accumulators to a tile's fp32 accumulator columns
// (column row at accum + row * col_stride, queries contiguous): entries 0, 1 (2, 3) of tile t are
// queries 8t + 2 (lane % 4) + {0, 1} of head-dim row first_row + 16 (warp % 4) + lane / 4 (+ 8).
// Pairs go as one float2 atomic where `pairs` (the tile's first query is 8-byte aligned in the
// accumulator; its column stride is even), else as two floats. Rows past head_dim and queries past
// valid_queries are not added.
template <int kQueryTiles>
__device__ __forceinline__ void add_dq_block(const float (&dq)[kQueryTiles][4], float* accum,
                                             std::int64_t col_stride, int first_row, int warp,
                                             int lane, int head_dim, int valid_queries,
                                             bool pairs) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = first_row + (warp % 4) * 16 + lane / 4 + 8 * r;
    if (row >= head_dim) continue;
    float* const dst = accum + row * col_stride;
#pragma unroll
    for (int t = 0; t < kQueryTiles; ++t) {
      const int q = t * 8 + 2 * (lane % 4);
      const float x0 = dq[t][2 * r], x1 = dq[t][2 * r + 1];
      if (pairs && q + 1 < valid_queries) {
        atomicAdd(reinterpret_cast<float2*>(dst + q), make_float2(x0, x1));
      } else {
        if (q < valid_queries) atomicAdd(dst + q, x0);
        if (q + 1 < valid_queries) atomicAdd(dst + q + 1, x1);
      }
    }
  }
}

template <int kD, int kN, int kM>
struct FusedDq {
  static_assert(bwd_fused_bucket(kD), "the warpgroups split D 64 by keys, D 128 / 256 by columns");
  static constexpr bool kSplitKeys = kD == 64;
  static constexpr int kKeys = kSplitKeys ? 64 : kN;  // the product's K, per warpgroup
  // A warpgroup's head-dim rows of the product, in products of 64 (the M of a wgmma).
  static constexpr int kColBlocks = kD > 128 ? 2 : 1;
  using DsTile = SwizzledTile<kN, kM>;                // dS^T: rows = keys, columns = queries
  // Whether the sums go through the sum tile and bulk reductions (up to D 128) or straight from
  // the registers by atomics (D 256).
  static constexpr bool kStagedSums = kD <= 128;
  // The sum tile after the dS^T tile, [kD columns][kM queries] fp32, rows padded by 8 floats (the
  // 8 rows of an accumulator store then fall on distinct bank groups; rows stay 16-byte aligned
  // for the bulk copies).
  static constexpr int kSumPitch = kM + 8;
  static constexpr int kSumBytes = kStagedSums ? kD * kSumPitch * 4 : 0;
  static_assert(kM % 4 == 0 && kSumBytes % 1024 == 0, "16-byte rows, 1024-byte tile");
  // A warpgroup's dQ^T accumulators: kColBlocks products of 64 head-dim rows x kM queries.
  using Accum = float[kColBlocks][kM / 8][4];

  // Stores this warp's 16 rows of dS^T (rows first_row.., A fragments of 16 columns each).
  template <int kSteps>
  __device__ __forceinline__ static void store_ds(std::uint32_t smem_ds, int first_row,
                                                  const std::uint32_t (&a)[kSteps][4], int lane) {
    store_fragments_stmatrix<DsTile>(smem_ds, first_row, a, lane);
  }

  __device__ __forceinline__ static void warpgroup_barrier(int warpgroup) {
    if (warpgroup == 0) {
      named_barrier_sync<kWarpgroupBarrier, 128>();
    } else {
      named_barrier_sync<kWarpgroupBarrier + 1, 128>();
    }
  }

  // Makes the stored dS^T rows visible to the warpgroup's (D 64) or the block's (D 128) product.
  __device__ __forceinline__ static void publish_ds(int warpgroup) {
    fence_proxy_async();
    if constexpr (kSplitKeys) {
      warpgroup_barrier(warpgroup);
    } else {
      __syncthreads();
    }
  }

  // The warpgroup's first head-dim row and first key of the product.
  __device__ __forceinline__ static int first_col(int warpgroup) {
    return kSplitKeys ? 0 : 64 * kColBlocks * warpgroup;
  }
  __device__ __forceinline__ static int first_key(int warpgroup) {
    return kSplitKeys ? 64 * warpgroup : 0;
  }

  // dq[c] = (K^T dS^T) rows [first_col + 64c, +64) over keys [first_key, +kKeys): issued, not
  // waited for.
  template <typename T, typename KTile>
  __device__ __forceinline__ static void product(Accum& dq, std::uint32_t smem_k,
                                                 std::uint32_t smem_ds, int warpgroup) {
#pragma unroll
    for (int c = 0; c < kColBlocks; ++c) {
      mn_product<T, kKeys / 16, KTile, DsTile>(dq[c], smem_k, first_col(warpgroup) + 64 * c,
                                               smem_ds, first_key(warpgroup));
    }
  }

  // Writes (accumulate = false) or adds (D 64: the other warpgroup's partial sum is there) this
  // warpgroup's dQ^T rows into the sum tile.
  __device__ __forceinline__ static void stage(const Accum& dq, std::uint32_t smem_sum,
                                               int warpgroup, int warp, int lane, bool accumulate) {
    static_assert(kStagedSums, "D 256 adds from the registers (add_registers)");
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int col = first_col(warpgroup) + (warp % 4) * 16 + lane / 4 + 8 * r;
#pragma unroll
      for (int t = 0; t < kM / 8; ++t) {
        const std::uint32_t at = smem_sum + (col * kSumPitch + t * 8 + 2 * (lane % 4)) * 4;
        float x0 = dq[0][t][2 * r], x1 = dq[0][t][2 * r + 1];
        if (accumulate) {
          float y0, y1;
          asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(y0), "=f"(y1) : "r"(at));
          x0 += y0;
          x1 += y1;
        }
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(x0), "f"(x1) : "memory");
      }
    }
  }

  // The threads that add the sum tile's rows: thread t < 64 of a warpgroup its row
  // first_col + t (D 64: the first warpgroup's only).
  __device__ __forceinline__ static bool adds_row(int warpgroup) {
    return static_cast<int>(threadIdx.x) % 128 < 64 && (!kSplitKeys || warpgroup == 0);
  }

  // Adds the warpgroup's rows of the sum tile (complete, and fenced for the async proxy by their
  // last writers) to `accum` (as `add`; D 64: all rows, by the first warpgroup). Where the tile's
  // first query is 16-byte aligned in the accumulator (`bulk`), each row's whole 4-float groups
  // are one bulk reduction (a bulk group, committed here) and its last 1..3 floats atomics;
  // elsewhere (varlen sequences starting off a multiple of 4) the warpgroup adds single floats.
  __device__ __forceinline__ static void add_sum(const float* sum, float* accum,
                                                 std::int64_t col_stride, int warpgroup,
                                                 int head_dim, int valid_queries, bool bulk) {
    if (kSplitKeys && warpgroup != 0) return;
    const int thread = static_cast<int>(threadIdx.x) % 128;
    if (bulk) {
      const int col = first_col(warpgroup) + thread;
      if (thread < 64 && col < head_dim) {
        const int whole = valid_queries / 4 * 4;
        float* const row = accum + col * col_stride;
        const float* const staged = sum + col * kSumPitch;
        if (whole > 0) {
          ::cuda::ptx::cp_reduce_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared,
                                            ::cuda::ptx::op_add, row, staged,
                                            static_cast<std::uint32_t>(whole * 4));
        }
        for (int q = whole; q < valid_queries; ++q) atomicAdd(row + q, staged[q]);
        ::cuda::ptx::cp_async_bulk_commit_group();
      }
      return;
    }
    for (int j = thread; j < 64 * kM; j += 128) {
      const int col = first_col(warpgroup) + j / kM, q = j % kM;
      if (col < head_dim && q < valid_queries) {
        atomicAdd(accum + col * col_stride + q, sum[col * kSumPitch + q]);
      }
    }
  }

  // Adds this thread's dQ^T accumulators (D 256: no sum tile) to `accum` (the step's tile: column
  // col at accum + col * col_stride, queries contiguous), block c as head-dim rows from
  // first_col + 64c (add_dq_block).
  __device__ __forceinline__ static void add_registers(const Accum& dq, float* accum,
                                                       std::int64_t col_stride, int warpgroup,
                                                       int warp, int lane, int head_dim,
                                                       int valid_queries, bool pairs) {
#pragma unroll
    for (int c = 0; c < kColBlocks; ++c) {
      add_dq_block(dq[c], accum, col_stride, first_col(warpgroup) + 64 * c, warp, lane, head_dim,
                   valid_queries, pairs);
    }
  }

  // The sum tile may be written again once this thread's bulk reductions have read it (before the
  // barrier that precedes the writes), and the kernel may end once they are done.
  __device__ __forceinline__ static void wait_sum_read(int warpgroup) {
    if (kStagedSums && adds_row(warpgroup)) {
      ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<0>{});
    }
  }
  __device__ __forceinline__ static void wait_sum_done(int warpgroup) {
    if (kStagedSums && adds_row(warpgroup)) {
      ::cuda::ptx::cp_async_bulk_wait_group(::cuda::ptx::n32_t<0>{});
    }
  }
};

}  // namespace fmha::cuda::sm90
