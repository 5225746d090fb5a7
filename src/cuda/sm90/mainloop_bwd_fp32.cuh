// The sm90 backward for fp32 inputs (tf32 wgmma; sm_90a only): a dK/dV kernel and a dQ kernel on
// operand planes (fp32_planes.cuh), the cases of the sm90 fp32 forward (head dims up to 64, plain
// and window policies, GQA, dense batches). Exact (3xTF32) as the forward; deterministic (no
// atomics: each gradient element has one writer, and every sum runs in a fixed order).
//
// Every product has both shared-memory operands K-major, the one contraction that tf32 wgmma
// reads; the planes provide the transposed operands (Q^T and dO^T over queries, K^T over keys,
// each 8-row group permuted as the accumulators hold P^T / dS^T / dS), so the A operands from
// registers come straight from the accumulators:
//   dK/dV (rows = a block's 64 keys):  S^T = K Q^T, dP^T = V dO^T (ss),
//                                      P^T = exp2(scale S^T - lse), dS^T = P^T (dP^T - Delta),
//                                      dV += P^T dO, dK += dS^T Q (rs; B = dO^T, Q^T)
//   dQ    (rows = a block's 64 queries): S = Q K^T, dP = dO V^T (ss), P, dS as above,
//                                      dQ += dS K (rs; B = K^T)
// dk = scale * dK, dq = scale * dQ (natural-unit scale). Products whose sum runs over a whole
// sequence (dV, dK, dQ) start from zero every tile and are added to their sums with rounded fp32
// adds (the tensor cores truncate what they add into an accumulator; mainloop_fwd_fp32.cuh).
//
// Both warpgroups of a block own all of its rows and take alternate tiles of the other side
// (tiles 0, 2, 4, ... and 1, 3, 5, ...), each with its own tiles in shared memory, one named
// barrier of its own and no block barrier inside the loop; their partial sums meet once at the
// end, through shared memory. A warpgroup's tiles form two halves that are used in turn: the
// natural ones (Q and dO, or K and V) by the first two products, the transposed one(s) by the
// last; each half is refilled with the next tile's as soon as its products have landed, so that
// one copy is always in flight beside the math.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/backward_params.h"
#include "cuda/common/backward_policies.cuh"
#include "cuda/common/block_coords.cuh"
#include "cuda/common/forward_policies.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm90/fp32_planes.cuh"
#include "cuda/sm90/fp32_products.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace fmha::cuda::sm90 {

struct Fp32BackwardPlanes {
  const float* q = nullptr;     // [B, H, q_rows, 128]
  const float* dout = nullptr;  // [B, H, q_rows, 128]
  const float* k = nullptr;     // [B, Hkv, k_rows, 128]
  const float* v = nullptr;     // [B, Hkv, k_rows, 128]
  const float* qt = nullptr;    // [B, H, 128, q_rows], queries permuted within 8
  const float* doutt = nullptr; // [B, H, 128, q_rows], likewise
  const float* kt = nullptr;    // [B, Hkv, 128, k_rows], keys permuted within 8
  std::int64_t q_rows = 0;      // Lq padded to kFp32BwdBlock
  std::int64_t k_rows = 0;      // Lk padded to kFp32BwdBlock
};

inline constexpr int kFp32BwdTile = 32;   // columns a warpgroup takes a step
inline constexpr int kFp32BwdThreads = 256;

template <int kRows>
using Fp32PlaneRows = SwizzledTile<kRows, 2 * kFp32PlaneRowFloats>;  // plane rows (hi | lo)
using Fp32PlaneCols = SwizzledTile<kFp32PlaneRowFloats, 2 * kFp32BwdTile>;  // 128 rows x tile

// A warpgroup's sum of a 64 x 64 gradient tile, left for the other (fp32_bwd::leave_sum).
inline constexpr int kFp32SumBytes = 64 * 64 * 4;

// Shared memory: the block's rows (two plane tiles), then each warpgroup's three (dK/dV: Q, dO,
// and Q^T, dO^T: four) step tiles, then the sums the warpgroups leave each other (dK/dV: two, dQ:
// one) in a place of their own, which no copy or product touches.
constexpr int fp32_bwd_smem_bytes(bool dkdv) {
  return 2 * Fp32PlaneRows<kFp32BwdBlock>::kBytes +
         2 * (2 * Fp32PlaneRows<kFp32BwdTile>::kBytes + (dkdv ? 2 : 1) * Fp32PlaneCols::kBytes) +
         (dkdv ? 2 : 1) * kFp32SumBytes + 1024;
}

namespace fp32_bwd {

constexpr int kSteps = kFp32PlaneWidth / 8;  // k8 steps of the head dim
constexpr int kTileSteps = kFp32BwdTile / 8;  // k8 steps of a column tile

// A warpgroup's barrier (ids 4, 5: wgmma.cuh's kWarpgroupBarrier).
__device__ __forceinline__ void warpgroup_sync(int warpgroup) {
  if (warpgroup == 0) {
    named_barrier_sync<kWarpgroupBarrier, 128>();
  } else {
    named_barrier_sync<kWarpgroupBarrier + 1, 128>();
  }
}

// Waits until this thread's copies but the newest kPending groups landed, then until every thread
// of the warpgroup is there, so that the warpgroup's tiles are whole and visible to wgmma.
template <int kPending>
__device__ __forceinline__ void wait_tiles(int warpgroup) {
  tile::cp_async_wait<kPending>();
  fence_proxy_async();
  warpgroup_sync(warpgroup);
}

// Accumulator entries as a tf32 A fragment pair per k-step (slot order of the planes).
template <int kTiles>
__device__ __forceinline__ void to_fragments(const float (&x)[kTiles][4],
                                             std::uint32_t (&hi)[kTiles][4],
                                             std::uint32_t (&lo)[kTiles][4]) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    split_tf32(x[j][0], hi[j][0], lo[j][0]);
    split_tf32(x[j][2], hi[j][1], lo[j][1]);
    split_tf32(x[j][1], hi[j][2], lo[j][2]);
    split_tf32(x[j][3], hi[j][3], lo[j][3]);
  }
}

// sum += A B over a column tile: A the fragments, B (N = 64) the transposed tile at `cols`
// (rows 0-63 hi, 64-127 lo), three products a k-step into a zeroed accumulator, then one rounded
// add into the running sum.
__device__ __forceinline__ void add_product(float (&sum)[8][4],
                                            const std::uint32_t (&hi)[kTileSteps][4],
                                            const std::uint32_t (&lo)[kTileSteps][4],
                                            std::uint32_t cols) {
  float part[8][4];
  const std::uint64_t b_hi = Fp32PlaneCols::k_major(cols, 0, 0);
  const std::uint64_t b_lo = Fp32PlaneCols::k_major(cols, kFp32PlaneWidth, 0);
  wgmma_fence();
  issue_split_rs<Fp32PlaneCols, kTileSteps, kFp32PlaneWidth>(part, hi, lo, b_hi, b_lo);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(part);
#pragma unroll
  for (int t = 0; t < 8; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sum[t][e] += part[t][e];
  }
}

// d = A B^T with A the block's rows (M = 64, at `rows`) and B a step tile (N = 32, at `cols`),
// both plane rows: hi*hi + hi*lo + lo*hi per k-step of the head dim. Issued, not waited for.
__device__ __forceinline__ void issue_rows_product(float (&d)[kTileSteps][4], std::uint32_t rows,
                                                   std::uint32_t cols) {
  using A = Fp32PlaneRows<kFp32BwdBlock>;
  using B = Fp32PlaneRows<kFp32BwdTile>;
  issue_split_ss<A, B, kSteps, kFp32BwdTile>(d, A::k_major(rows, 0, 0), B::k_major(cols, 0, 0));
}

// A step's S (or S^T) and dP (or dP^T): the block's row tiles against the warpgroup's natural step
// tiles, once those have landed (the older of the two groups in flight); returns with every warp of
// the warpgroup past them, so that the caller may refill them.
__device__ __forceinline__ void score_products(float (&s)[kTileSteps][4],
                                               float (&dp)[kTileSteps][4], std::uint32_t s_rows,
                                               std::uint32_t s_cols, std::uint32_t dp_rows,
                                               std::uint32_t dp_cols, int warpgroup) {
  wait_tiles<1>(warpgroup);
  wgmma_fence();
  issue_rows_product(s, s_rows, s_cols);
  issue_rows_product(dp, dp_rows, dp_cols);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(s);
  fence_accumulators(dp);
  warpgroup_sync(warpgroup);
}

// The scores times scale_log2: log2 units, the exponent's argument before the row statistics.
__device__ __forceinline__ void scale_scores(float (&s)[kTileSteps][4], float scale_log2) {
#pragma unroll
  for (int t = 0; t < kTileSteps; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[t][e] *= scale_log2;
  }
}

// The two warpgroups' sums of one 64 x 64 gradient tile meet: one leaves its sum in `scratch`,
// the other adds it to its own after a block barrier.
// Entry e of thread t at e * 128 + t: consecutive threads, consecutive words.
__device__ __forceinline__ void leave_sum(const float (&sum)[8][4], float* scratch, int thread) {
#pragma unroll
  for (int t = 0; t < 8; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) scratch[(4 * t + e) * 128 + thread] = sum[t][e];
  }
}
__device__ __forceinline__ void take_sum(float (&sum)[8][4], const float* scratch, int thread) {
#pragma unroll
  for (int t = 0; t < 8; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sum[t][e] += scratch[(4 * t + e) * 128 + thread];
  }
}

// Writes scale * sum, rows first_row + (16 warp + g, + 8), columns 8t + 2c (+1), inside
// [num_rows, cols), at `out` (row stride in floats).
__device__ __forceinline__ void store_rows(const float (&sum)[8][4], float scale, float* out,
                                           std::int64_t row_stride, std::int64_t first_row,
                                           std::int64_t num_rows, int cols, int warp, int lane) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t i = first_row + 16 * warp + lane / 4 + 8 * r;
    if (i >= num_rows) continue;
    float* row = out + i * row_stride;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const int c = 8 * t + 2 * (lane % 4);
      if (c < cols) row[c] = sum[t][2 * r] * scale;
      if (c + 1 < cols) row[c + 1] = sum[t][2 * r + 1] * scale;
    }
  }
}

// A block's shared memory and its thread's place: from a 1024-byte aligned base the block's rows
// (two plane tiles: K, V or Q, dO), then each warpgroup's step tiles (two of plane rows, then
// kTransposedTiles transposed ones), then the sums the warpgroups leave each other.
template <int kTransposedTiles>
struct BlockSmem {
  using Rows = Fp32PlaneRows<kFp32BwdBlock>;
  using Step = Fp32PlaneRows<kFp32BwdTile>;
  static constexpr int kStepBytes = 2 * Step::kBytes + kTransposedTiles * Fp32PlaneCols::kBytes;
  std::uint32_t rows;      // the first row tile; the second follows
  std::uint8_t* rows_ptr;  // the same address, generic
  int warpgroup, thread, warp, lane;
  std::uint32_t step;  // this warpgroup's step tiles

  __device__ __forceinline__ explicit BlockSmem(std::uint8_t* smem_raw) {
    rows = (tile::shared_address(smem_raw) + 1023u) & ~1023u;
    rows_ptr = smem_raw + (rows - tile::shared_address(smem_raw));
    warpgroup = warpgroup_index();
    thread = static_cast<int>(threadIdx.x) % 128;
    warp = thread / 32, lane = thread % 32;
    step = rows + 2 * Rows::kBytes + warpgroup * kStepBytes;
  }
  __device__ __forceinline__ float* sums() const {
    return reinterpret_cast<float*>(rows_ptr + 2 * Rows::kBytes + 2 * kStepBytes);
  }
};

}  // namespace fp32_bwd

// dK and dV of 64 keys of one (batch, kv head): every query head of its GQA group and, per head,
// the query tiles of 32 that the mask lets see those keys. Grid (k_rows / 64, Hkv, B).
template <typename Policy>
__global__ void __launch_bounds__(kFp32BwdThreads, 1)
    backward_dkdv_fp32_kernel(const __grid_constant__ BackwardParams p,
                              const __grid_constant__ Fp32BackwardPlanes planes) {
  using namespace fp32_bwd;
  using Mask = typename Policy::Mask;
  using Rows = Fp32PlaneRows<kFp32BwdBlock>;
  using Step = Fp32PlaneRows<kFp32BwdTile>;
  using Cols = Fp32PlaneCols;
  constexpr int kN = kFp32BwdBlock, kM = kFp32BwdTile;
  const ForwardParams& f = p.fwd;

  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  const BlockSmem<2> smem(smem_raw);
  static_assert(fp32_bwd_smem_bytes(true) ==
                    2 * Rows::kBytes + 2 * BlockSmem<2>::kStepBytes + 2 * kFp32SumBytes + 1024,
                "as the launcher counts");
  const int warpgroup = smem.warpgroup, thread = smem.thread, warp = smem.warp, lane = smem.lane;
  const std::uint32_t smem_k = smem.rows, smem_v = smem_k + Rows::kBytes;
  const std::uint32_t smem_q = smem.step, smem_do = smem_q + Step::kBytes;
  const std::uint32_t smem_qt = smem_do + Step::kBytes, smem_dot = smem_qt + Cols::kBytes;

  const std::int64_t b = blockIdx.z;
  const int g = static_cast<int>(blockIdx.y);
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * kN;
  const std::int64_t num_queries = f.seqlen_q, num_keys = f.seqlen_k;
  const int group = f.kv_group;
  const std::int64_t kv_plane = b * (f.heads / group) + g;
  const Mask mask = Mask::make(f, num_queries, num_keys);
  const std::int64_t last_key = (n0 + kN < num_keys ? n0 + kN : num_keys) - 1;
  const QueryRange range = query_range(mask, n0, last_key, num_queries);
  const std::int64_t first_query = range.begin / kM * kM;
  const int tiles =
      range.end > range.begin ? static_cast<int>((range.end - first_query + kM - 1) / kM) : 0;
  const int items = tiles * group;  // (head, query tile) pairs; this warpgroup's: every other one

  auto q_plane = [&](const float* plane, int item) {  // the item's head's plane
    return plane + (b * f.heads + g * group + item / tiles) * planes.q_rows * kFp32PlaneRowFloats;
  };
  auto first_row = [&](int item) {
    return first_query + static_cast<std::int64_t>(item % tiles) * kM;
  };
  auto copy_natural = [&](int item) {
    const std::int64_t m0 = first_row(item);
    copy_plane_tile<Step, kM, kFp32PlaneRowFloats / 4, 128>(
        smem_q, q_plane(planes.q, item) + m0 * kFp32PlaneRowFloats, kFp32PlaneRowFloats, thread);
    copy_plane_tile<Step, kM, kFp32PlaneRowFloats / 4, 128>(
        smem_do, q_plane(planes.dout, item) + m0 * kFp32PlaneRowFloats, kFp32PlaneRowFloats,
        thread);
  };
  auto copy_transposed = [&](int item) {
    const std::int64_t m0 = first_row(item);
    copy_plane_tile<Cols, kFp32PlaneRowFloats, kM / 4, 128>(smem_qt, q_plane(planes.qt, item) + m0,
                                                            planes.q_rows, thread);
    copy_plane_tile<Cols, kFp32PlaneRowFloats, kM / 4, 128>(
        smem_dot, q_plane(planes.doutt, item) + m0, planes.q_rows, thread);
  };

  // The block's keys (every thread), then this warpgroup's first item's halves: three groups.
  copy_plane_tile<Rows, kN, kFp32PlaneRowFloats / 4, kFp32BwdThreads>(
      smem_k, planes.k + (kv_plane * planes.k_rows + n0) * kFp32PlaneRowFloats,
      kFp32PlaneRowFloats, threadIdx.x);
  copy_plane_tile<Rows, kN, kFp32PlaneRowFloats / 4, kFp32BwdThreads>(
      smem_v, planes.v + (kv_plane * planes.k_rows + n0) * kFp32PlaneRowFloats,
      kFp32PlaneRowFloats, threadIdx.x);
  tile::cp_async_commit();
  if (warpgroup < items) copy_natural(warpgroup);
  tile::cp_async_commit();
  if (warpgroup < items) copy_transposed(warpgroup);
  tile::cp_async_commit();
  tile::cp_async_wait<2>();
  fence_proxy_async();
  __syncthreads();

  float dk[8][4], dv[8][4];
#pragma unroll
  for (int t = 0; t < 8; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[t][e] = dv[t][e] = 0.0f;
  }
  const std::int64_t key_row = n0 + 16 * warp + lane / 4;
  for (int item = warpgroup; item < items; item += 2) {
    const int h = g * group + item / tiles;
    const std::int64_t m0 = first_row(item);
    // This thread's queries: 8t + 2c + e of the tile. Rows past the sequence contribute nothing.
    float lse[kTileSteps][2], delta[kTileSteps][2];
    const float* lse_row = p.lse_log2 + b * p.stat_batch_stride + h * p.stat_head_stride;
    const float* delta_row = p.delta + b * p.stat_batch_stride + h * p.stat_head_stride;
#pragma unroll
    for (int t = 0; t < kTileSteps; ++t) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const std::int64_t i = m0 + 8 * t + 2 * (lane % 4) + e;
        lse[t][e] = i < num_queries ? lse_row[i] : INFINITY;
        delta[t][e] = i < num_queries ? delta_row[i] : 0.0f;
      }
    }

    float s[kTileSteps][4], dp[kTileSteps][4];  // S^T, dP^T
    score_products(s, dp, smem_k, smem_q, smem_v, smem_do, warpgroup);
    if (item + 2 < items) copy_natural(item + 2);  // Q and dO are read: refill them
    tile::cp_async_commit();
    scale_scores(s, f.scale_log2);
    hide_invisible_transposed(mask, s, key_row, m0 + 2 * (lane % 4), num_queries);
    float ds[kTileSteps][4];
#pragma unroll
    for (int t = 0; t < kTileSteps; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[t][e] = exp2_ftz(s[t][e] - lse[t][e % 2]);  // P^T
        ds[t][e] = s[t][e] * (dp[t][e] - delta[t][e % 2]);
      }
    }
    std::uint32_t a_hi[kTileSteps][4], a_lo[kTileSteps][4];
    wait_tiles<1>(warpgroup);  // Q^T, dO^T
    to_fragments(s, a_hi, a_lo);
    fence_fragments(a_hi);
    fence_fragments(a_lo);
    add_product(dv, a_hi, a_lo, smem_dot);
    to_fragments(ds, a_hi, a_lo);
    fence_fragments(a_hi);
    fence_fragments(a_lo);
    add_product(dk, a_hi, a_lo, smem_qt);
    warpgroup_sync(warpgroup);  // Q^T and dO^T read: refill them
    if (item + 2 < items) copy_transposed(item + 2);
    tile::cp_async_commit();
  }
  tile::cp_async_wait<0>();
  __syncthreads();

  // Warpgroup 0 writes dk, warpgroup 1 dv, each with the other's share added.
  float* const sums = smem.sums();
  if (warpgroup == 0) {  // (a branch: choosing the array by a ternary would put both in memory)
    leave_sum(dv, sums, thread);
  } else {
    leave_sum(dk, sums + kFp32SumBytes / 4, thread);
  }
  // Two block barriers: with one, racecheck reported the other warpgroup's reads as racing with
  // the last warp's writes in some blocks (H200, 2026-11-27, four runs; the writes precede the barrier in
  // program order, and moving the sums out of the step tiles changed nothing). Not understood;
  // the second barrier costs one barrier a block.
  __syncthreads();
  __syncthreads();
  const float* const other = sums + (1 - warpgroup) * (kFp32SumBytes / 4);
  if (warpgroup == 0) {
    take_sum(dk, other, thread);
    store_rows(dk, p.scale,
               static_cast<float*>(p.dk) + b * p.dk_batch_stride + g * p.dk_head_stride,
               p.dk_row_stride, n0, num_keys, f.head_dim, warp, lane);
  } else {
    take_sum(dv, other, thread);
    store_rows(dv, 1.0f,
               static_cast<float*>(p.dv) + b * p.dv_batch_stride + g * p.dv_head_stride,
               p.dv_row_stride, n0, num_keys, f.value_dim, warp, lane);
  }
}

// dQ of 64 queries of one (batch, head): the key tiles of 32 the mask lets them see. Grid
// (q_rows / 64, H, B).
template <typename Policy>
__global__ void __launch_bounds__(kFp32BwdThreads, 1)
    backward_dq_fp32_kernel(const __grid_constant__ BackwardParams p,
                            const __grid_constant__ Fp32BackwardPlanes planes) {
  using namespace fp32_bwd;
  using Mask = typename Policy::Mask;
  using Rows = Fp32PlaneRows<kFp32BwdBlock>;
  using Step = Fp32PlaneRows<kFp32BwdTile>;
  using Cols = Fp32PlaneCols;
  constexpr int kM = kFp32BwdBlock, kN = kFp32BwdTile;
  const ForwardParams& f = p.fwd;

  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  const BlockSmem<1> smem(smem_raw);
  static_assert(fp32_bwd_smem_bytes(false) ==
                    2 * Rows::kBytes + 2 * BlockSmem<1>::kStepBytes + kFp32SumBytes + 1024,
                "as the launcher counts");
  const int warpgroup = smem.warpgroup, thread = smem.thread, warp = smem.warp, lane = smem.lane;
  const std::uint32_t smem_q = smem.rows, smem_do = smem_q + Rows::kBytes;
  const std::uint32_t smem_k = smem.step, smem_v = smem_k + Step::kBytes;
  const std::uint32_t smem_kt = smem_v + Step::kBytes;

  const std::int64_t b = blockIdx.z;
  const int h = static_cast<int>(blockIdx.y);
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.x) * kM;
  const std::int64_t num_queries = f.seqlen_q, num_keys = f.seqlen_k;
  const std::int64_t kv_plane = b * (f.heads / f.kv_group) + h / f.kv_group;
  const std::int64_t q_plane = b * f.heads + h;
  const Mask mask = Mask::make(f, num_queries, num_keys);
  const std::int64_t last_row = (m0 + kM < num_queries ? m0 + kM : num_queries) - 1;
  const KeyRange range = mask.key_range(m0, last_row);
  const std::int64_t first_key = range.begin / kN * kN;
  const int tiles =
      range.end > range.begin ? static_cast<int>((range.end - first_key + kN - 1) / kN) : 0;

  auto first_col = [&](int u) { return first_key + static_cast<std::int64_t>(u) * kN; };
  auto copy_natural = [&](int u) {
    const float* rows = planes.k + (kv_plane * planes.k_rows + first_col(u)) * kFp32PlaneRowFloats;
    copy_plane_tile<Step, kN, kFp32PlaneRowFloats / 4, 128>(smem_k, rows, kFp32PlaneRowFloats,
                                                            thread);
    rows = planes.v + (kv_plane * planes.k_rows + first_col(u)) * kFp32PlaneRowFloats;
    copy_plane_tile<Step, kN, kFp32PlaneRowFloats / 4, 128>(smem_v, rows, kFp32PlaneRowFloats,
                                                            thread);
  };
  auto copy_transposed = [&](int u) {
    copy_plane_tile<Cols, kFp32PlaneRowFloats, kN / 4, 128>(
        smem_kt, planes.kt + kv_plane * kFp32PlaneRowFloats * planes.k_rows + first_col(u),
        planes.k_rows, thread);
  };

  copy_plane_tile<Rows, kM, kFp32PlaneRowFloats / 4, kFp32BwdThreads>(
      smem_q, planes.q + (q_plane * planes.q_rows + m0) * kFp32PlaneRowFloats,
      kFp32PlaneRowFloats, threadIdx.x);
  copy_plane_tile<Rows, kM, kFp32PlaneRowFloats / 4, kFp32BwdThreads>(
      smem_do, planes.dout + (q_plane * planes.q_rows + m0) * kFp32PlaneRowFloats,
      kFp32PlaneRowFloats, threadIdx.x);
  tile::cp_async_commit();
  if (warpgroup < tiles) copy_natural(warpgroup);
  tile::cp_async_commit();
  if (warpgroup < tiles) copy_transposed(warpgroup);
  tile::cp_async_commit();

  // This thread's rows' statistics (rows past the sequence contribute nothing).
  const std::int64_t fragment_row = m0 + 16 * warp + lane / 4;
  float lse[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t i = fragment_row + 8 * r;
    const std::int64_t at = b * p.stat_batch_stride + h * p.stat_head_stride + i;
    lse[r] = i < num_queries ? p.lse_log2[at] : INFINITY;
    delta[r] = i < num_queries ? p.delta[at] : 0.0f;
  }
  tile::cp_async_wait<2>();
  fence_proxy_async();
  __syncthreads();

  float dq[8][4];
#pragma unroll
  for (int t = 0; t < 8; ++t) dq[t][0] = dq[t][1] = dq[t][2] = dq[t][3] = 0.0f;
  for (int u = warpgroup; u < tiles; u += 2) {
    const std::int64_t key0 = first_col(u);
    float s[kTileSteps][4], dp[kTileSteps][4];
    score_products(s, dp, smem_q, smem_k, smem_do, smem_v, warpgroup);
    if (u + 2 < tiles) copy_natural(u + 2);  // K and V are read: refill them
    tile::cp_async_commit();
    scale_scores(s, f.scale_log2);
    hide_invisible(mask, s, fragment_row, key0 + 2 * (lane % 4));
#pragma unroll
    for (int t = 0; t < kTileSteps; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pr = exp2_ftz(s[t][e] - lse[e / 2]);
        s[t][e] = pr * (dp[t][e] - delta[e / 2]);  // dS
      }
    }
    std::uint32_t a_hi[kTileSteps][4], a_lo[kTileSteps][4];
    to_fragments(s, a_hi, a_lo);
    fence_fragments(a_hi);
    fence_fragments(a_lo);
    wait_tiles<1>(warpgroup);  // K^T
    add_product(dq, a_hi, a_lo, smem_kt);
    warpgroup_sync(warpgroup);  // K^T read: refill it
    if (u + 2 < tiles) copy_transposed(u + 2);
    tile::cp_async_commit();
  }
  tile::cp_async_wait<0>();
  __syncthreads();

  float* const sum = smem.sums();
  if (warpgroup == 1) leave_sum(dq, sum, thread);
  __syncthreads();  // two, as the dK/dV kernel's (there racecheck reported one as not enough)
  __syncthreads();
  if (warpgroup == 0) {
    take_sum(dq, sum, thread);
    store_rows(dq, p.scale, static_cast<float*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride,
               p.dq_row_stride, m0, num_queries, f.head_dim, warp, lane);
  }
}

}  // namespace fmha::cuda::sm90
