// The sm90 forward for fp32 inputs (tf32 wgmma; sm_90a only), head dims up to 64, the plain and
// window policies (causal included), sinks, GQA and lse; dense batches. Everything else in fp32
// runs the sm80 kernels (dispatch_fwd.cu: fp32_planes_apply).
//
// Exact by SPEC §13 (3xTF32): every product is hi*hi + hi*lo + lo*hi of operands split by the
// planes pass (fp32_planes.cuh), three tf32 wgmma a k-step. allow_tf32 runs the same three
// products: it permits tf32, and exact costs this kernel little (its tensor time is a fraction of
// the softmax's and the copies').
//
// One block: 128 queries of one (batch, head), 64 a warpgroup, no copy warpgroup. Per key tile of
// 64 (two stages, every thread copies by cp.async from the planes, whose tiles are whole):
//   S = Q K^T                  (ss: Q and K, hi | lo rows, K-major)
//   mask, online softmax       (forward_softmax.cuh; the scale folded into the exponent)
//   PV = P V, O += PV          (rs: P split in registers into tf32 A fragments, the key order of
//                               the accumulator; B the transposed, permuted V of the planes)
// PV starts from zero every tile and is added to O with a rounded fp32 add: the tensor cores
// truncate what they add into an accumulator, and 3 x 8 k-steps of 64 keys stay far under SPEC
// §13's bound where the thousands of a whole row would not (as the sm80 fp32 forward does).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/block_coords.cuh"
#include "cuda/common/forward_params.h"
#include "cuda/common/forward_policies.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/tile_operands.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm90/forward_softmax.cuh"
#include "cuda/sm90/fp32_planes.cuh"
#include "cuda/sm90/fp32_products.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace fmha::cuda::sm90 {

inline constexpr int kFp32Stages = 2;
inline constexpr int kFp32Threads = 256;

// Tiles in wgmma's swizzled layout, counted in 16-bit columns (a float is two): a Q / K tile row
// is a plane row (hi | lo, 512 bytes); a V^T tile has the 128 rows hi | lo of 64 keys each.
using Fp32QTile = SwizzledTile<kFp32QueryTile, 2 * kFp32PlaneRowFloats>;
using Fp32KTile = SwizzledTile<kFp32KeyTile, 2 * kFp32PlaneRowFloats>;
using Fp32VtTile = SwizzledTile<kFp32PlaneRowFloats, 2 * kFp32KeyTile>;

constexpr int fp32_forward_smem_bytes() {
  return Fp32QTile::kBytes + kFp32Stages * (Fp32KTile::kBytes + Fp32VtTile::kBytes) + 1024;
}

template <typename Policy>
__global__ void __launch_bounds__(kFp32Threads, 1)
    forward_fp32_kernel(const __grid_constant__ ForwardParams p,
                        const __grid_constant__ Fp32Planes planes) {
  using Mask = typename Policy::Mask;
  constexpr int kM = kFp32QueryTile, kN = kFp32KeyTile;
  constexpr int kSteps = kFp32PlaneWidth / 8;  // k8 steps of the head dim, and of a key tile
  constexpr int kTiles = kN / 8;               // n8 tiles of S, and of O (64 value columns)
  static_assert(kTiles == kSteps, "S's key tiles are P V's k-steps");
  using QTile = Fp32QTile;
  using KTile = Fp32KTile;
  using VtTile = Fp32VtTile;

  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  const std::uint32_t smem_q = (tile::shared_address(smem_raw) + 1023u) & ~1023u;
  auto smem_k = [&](int stage) {
    return smem_q + QTile::kBytes + stage * (KTile::kBytes + VtTile::kBytes);
  };
  auto smem_vt = [&](int stage) { return smem_k(stage) + KTile::kBytes; };

  const BlockCoords coords = block_coords<false>(p);
  const std::int64_t b = coords.batch;
  const int h = coords.head;
  const std::int64_t m0 = (coords.tiles - 1 - coords.tile) * kM;  // causal: longest rows first
  const std::int64_t num_queries = p.seqlen_q, num_keys = p.seqlen_k;
  const std::int64_t kv_heads = p.heads / p.kv_group;
  const std::int64_t kv_plane = b * kv_heads + h / p.kv_group;
  const Mask mask = Mask::make(p, num_queries, num_keys);
  const std::int64_t last_row = (m0 + kM < num_queries ? m0 + kM : num_queries) - 1;
  const KeyRange range = mask.key_range(m0, last_row);
  // Whole tiles of the planes: the first starts at a multiple of the tile (the planes' padding).
  const std::int64_t first_key = range.begin / kN * kN;
  const int tiles = range.end > range.begin
                        ? static_cast<int>((range.end - first_key + kN - 1) / kN)
                        : 0;

  const int warpgroup = warpgroup_index();
  const int warp = (static_cast<int>(threadIdx.x) % 128) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t fragment_row = m0 + 64 * warpgroup + 16 * warp + lane / 4;
  const int fragment_col = 2 * (lane % 4);

  const float* q_plane =
      planes.q + ((b * p.heads + h) * planes.q_rows + m0) * kFp32PlaneRowFloats;
  const float* k_plane = planes.k + kv_plane * planes.k_rows * kFp32PlaneRowFloats;
  const float* vt_plane = planes.vt + kv_plane * kFp32PlaneRowFloats * planes.k_rows;
  auto load_tile = [&](int u) {
    const int stage = u % kFp32Stages;
    const std::int64_t key = first_key + static_cast<std::int64_t>(u) * kN;
    copy_plane_tile<KTile, kN, kFp32PlaneRowFloats / 4, kFp32Threads>(
        smem_k(stage), k_plane + key * kFp32PlaneRowFloats, kFp32PlaneRowFloats, threadIdx.x);
    copy_plane_tile<VtTile, kFp32PlaneRowFloats, kN / 4, kFp32Threads>(
        smem_vt(stage), vt_plane + key, planes.k_rows, threadIdx.x);
  };
  copy_plane_tile<QTile, kM, kFp32PlaneRowFloats / 4, kFp32Threads>(smem_q, q_plane,
                                                                   kFp32PlaneRowFloats, threadIdx.x);
  if (tiles > 0) load_tile(0);
  tile::cp_async_commit();

  // The scale folds into the exponent when positive (forward_softmax.cuh); otherwise it is applied
  // to the scores first, before the mask's -inf.
  const bool folded = p.scale_log2 > 0.0f;
  const float exp_scale = folded ? p.scale_log2 : 1.0f;
  const float no_offset[2][1] = {{0.0f}, {0.0f}};
  OnlineSoftmax softmax;
  softmax.init();
  float o[kTiles][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;

  const std::uint64_t q_desc = QTile::k_major(smem_q, 64 * warpgroup, 0);
  for (int u = 0; u < tiles; ++u) {
    // Tile u landed (this thread's copies, then everyone's), and every thread is past tile u - 1,
    // whose stage tile u + 1 refills.
    tile::cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if (u + 1 < tiles) load_tile(u + 1);
    tile::cp_async_commit();
    const int stage = u % kFp32Stages;
    const std::int64_t key0 = first_key + static_cast<std::int64_t>(u) * kN;

    // S = Q K^T: hi*hi + hi*lo + lo*hi per k-step (hi k-steps 0-7 of a plane row, lo 8-15).
    float s[kTiles][4];
    const std::uint64_t k_desc = KTile::k_major(smem_k(stage), 0, 0);
    wgmma_fence();
    issue_split_ss<QTile, KTile, kSteps, kN>(s, q_desc, k_desc);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(s);

    if (!folded) {
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] *= p.scale_log2;
      }
    }
    if (!mask.tile_is_full(m0, last_row, key0, kN)) {
      hide_invisible(mask, s, fragment_row, key0 + fragment_col);
    }
    softmax_update<1>(softmax, s, o, exp_scale, no_offset);

    // P as tf32 A fragments: k-slot c of step j holds key 8j + 2c, slot c + 4 key 8j + 2c + 1
    // (fp32_planes.cuh's order), i.e. accumulator entries 0, 2, 1, 3.
    std::uint32_t p_hi[kSteps][4], p_lo[kSteps][4];
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
      split_tf32(s[j][0], p_hi[j][0], p_lo[j][0]);
      split_tf32(s[j][2], p_hi[j][1], p_lo[j][1]);
      split_tf32(s[j][1], p_hi[j][2], p_lo[j][2]);
      split_tf32(s[j][3], p_hi[j][3], p_lo[j][3]);
    }
    fence_fragments(p_hi);
    fence_fragments(p_lo);
    float pv[kTiles][4];
    const std::uint64_t v_hi = VtTile::k_major(smem_vt(stage), 0, 0);
    const std::uint64_t v_lo = VtTile::k_major(smem_vt(stage), kFp32PlaneWidth, 0);
    wgmma_fence();
    issue_split_rs<VtTile, kSteps, kFp32PlaneWidth>(pv, p_hi, p_lo, v_hi, v_lo);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(pv);
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[t][e] += pv[t][e];
    }
  }
  tile::cp_async_wait<0>();  // Q's copy is in flight when the block had no key tile

  const float sink_log2 = p.sinks != nullptr ? p.sinks[h * p.sinks_stride] * kLog2e : -INFINITY;
  float factor[2], lse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) factor[r] = softmax.finish_row(r, sink_log2, &lse[r]);
  float* out = static_cast<float*>(p.out) + b * p.out_batch_stride + h * p.out_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t i = fragment_row + 8 * r;
    if (i >= num_queries) continue;
    if (p.lse != nullptr && lane % 4 == 0) {
      p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i * p.lse_row_stride] = lse[r];
    }
    float* row = out + i * p.out_row_stride;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const int c = 8 * t + fragment_col;
      if (c < p.value_dim) row[c] = o[t][2 * r] * factor[r];
      if (c + 1 < p.value_dim) row[c + 1] = o[t][2 * r + 1] * factor[r];
    }
  }
}

}  // namespace fmha::cuda::sm90
