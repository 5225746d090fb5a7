// Definition of sm90::launch_forward; included only by the instantiation files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/common/kernel_attributes.h"
#include "cuda/sm90/launch_fwd.h"
#include "cuda/sm90/launch_limits.h"
#include "cuda/sm90/mainloop_fwd.cuh"

namespace fmha::cuda::sm90 {

namespace detail {

// Pitch of the staged rel_h | rel_w rows (rel_h padded to an even count): a byte stride of 16
// modulo 128, so that the 8 rows x 4 pair loads of a warp's fragment fall in 32 different banks.
inline int rel_staged_pitch(std::int64_t rel_h_size, std::int64_t rel_w_size) {
  const std::int64_t width = (rel_h_size + 1) / 2 * 2 + rel_w_size;
  return static_cast<int>((width + 63) / 64 * 64 + 8);
}

}  // namespace detail

static_assert(fwd_warp_groups<64, PolicyPlain>() == 3 && fwd_warp_groups<64, PolicyWindow>() == 2,
              "plain_on_window_kernel (launch_fwd.h) weighs 192-row plain tiles against 128-row "
              "window tiles");

template <typename T, int kD, typename Policy>
Status launch_forward(const ForwardParams& params, cudaStream_t stream) {
  ForwardParams p = params;
  if constexpr (std::is_same_v<Policy, PolicyPlain> &&
                fwd_block_n<kD, PolicyPlainLongRows>() != block_n(kD)) {
    if (p.seqlen_k >= kLongRowKeys && long_row_tiles_enabled()) {
      return launch_forward<T, kD, PolicyPlainLongRows>(params, stream);
    }
  }
  if constexpr (std::is_same_v<Policy, PolicyWindow> &&
                fwd_warp_groups<kD, PolicyWindowLongRows>() != fwd_warp_groups<kD, Policy>()) {
    const std::int64_t min_rows = wide_window_min_rows();
    // The band a row sees: a window's left side, or every key before the row under a causal mask.
    const bool long_band = p.window_left >= min_rows - 1;
    if (min_rows > 0 && p.seqlen_q >= min_rows && long_band) {
      return launch_forward<T, kD, PolicyWindowLongRows>(params, stream);
    }
  }
  if constexpr (!kCacheForm<Policy>) {
    if (p.block_table != nullptr || p.seqused_k != nullptr) {
      return Status::backend_error(
          "fmha: CUDA forward kernel (sm90): a KV cache reached a policy that does not read one "
          "(an internal error)");
    }
  }
  constexpr bool kTokenTiles = Policy::Mask::kTokenTiles;
  constexpr int kM = fwd_block_m<kD, Policy>();
  // Token tiles keep their bookkeeping after the K/V stages, and stage neither bias nor rel-pos
  // (their rows are no ranges of the sequence).
  int smem = tile_smem_bytes<kD, Policy>() + kSmemAlignSlack +
             (kTokenTiles ? static_cast<int>(sizeof(FwdTokenTiles<kD, Policy>)) : 0);
  const int max_smem = max_block_smem();
  // Bias: stage its tiles next to the K/V tiles (cp.async) when their rows are whole 16-byte
  // chunks and the tiles fit.
  if (kGeneralForm<Policy> && bias_stageable(p) &&
      smem + kv_stages(kD, true) * bias_tile_bytes(kD) <= max_smem) {
    p.bias_staged = true;
    smem += kv_stages(kD, true) * bias_tile_bytes(kD);
  }
  if constexpr (kBiasForm<Policy>) {
    if (!bias_registers_apply(p)) return launch_forward<T, kD, PolicyGeneral>(params, stream);
    // A bias shared by the batches is read from memory once with the batch innermost
    // (block_coords.cuh).
    p.batch_innermost = bias_shared_by_batches(p);
  } else if constexpr (kRelPosForm<Policy>) {
    // The register form (two grid rows a key tile, nothing staged); else the general path. Its
    // rel_h fetch takes key positions as 32-bit, one tile past the last (fetch_rel_h).
    if (!rel_pos_registers_apply(p.rel_w_size, block_n(kD)) || p.cu_seqlens_q != nullptr ||
        p.seqlen_k > (std::int64_t{1} << 31) - 2 * block_n(kD)) {
      return launch_forward<T, kD, PolicyGeneral>(params, stream);
    }
  } else if (!kTokenTiles && p.rel_h != nullptr && p.cu_seqlens_q == nullptr &&
             p.seqlen_k < (std::int64_t{1} << 31)) {
    // SAM-style rel-pos: stage the block's rel_h | rel_w rows in shared memory when they fit.
    const int pitch =
        detail::rel_staged_pitch((p.seqlen_k + p.rel_w_size - 1) / p.rel_w_size, p.rel_w_size);
    const std::int64_t staged = std::int64_t{kM} * pitch * 2;
    if (smem + staged <= max_smem) {
      p.rel_staged_pitch = pitch;
      smem += static_cast<int>(staged);
    }
  }
  // A copy warpgroup's barriers follow the tiles (its policies stage nothing else), and its
  // tensor maps: Q in blocks of the block's rows, K and V in key tiles (tile_copies.cuh).
  ForwardTileMaps maps;
  if constexpr (kCopyWarpgroup<kD, Policy>) {
    smem += static_cast<int>(sizeof(StageBarriers<stages_of<kD, Policy>()>));
    using QTile = SwizzledTile<kM, kD>;
    constexpr int kN = fwd_block_n<kD, Policy>();
    // Over a KV cache (the cache policies) too: the kernel copies by TMA the key tiles that a
    // sequence fills (its last, partial one by cp.async, whose zero fill keeps the stale rows past
    // the sequence's length, maybe NaN, out of P V), a paged cache's in boxes of a page
    // (pool_box_rows; other page sizes are gathered by the copy threads).
    const bool paged = p.block_table != nullptr;
    maps.kv_box_rows = paged ? pool_box_rows(p.page_size, kN) : kN;
    maps.usable = !kTokenTiles && tma_enabled() && p.cu_seqlens_q == nullptr &&
                  maps.kv_box_rows > 0 &&
                  encode_rows_map(&maps.q, p.q, p.head_dim, p.seqlen_q, p.heads, p.batch,
                                  p.q_row_stride, p.q_head_stride, p.q_batch_stride,
                                  QTile::kBlockCols, kM, QTile::kSwizzleBytes) &&
                  (paged ? encode_pool_maps<QTile>(&maps.k, &maps.v, p, maps.kv_box_rows)
                         : encode_kv_maps<QTile>(&maps.k, &maps.v, p, kN));
    if constexpr (bias_ring<kD, Policy>()) {
      // The bias by TMA in boxes of the block's rows where a map describes it (else the register
      // form), with every main key tile by TMA (no KV cache).
      maps.bias_usable = maps.usable && p.seqused_k == nullptr &&
                         encode_bias_map<BiasTile<kD>>(&maps.bias, p, kM);
    }
    if constexpr (output_tile<kD, Policy>() || output_chunks<kD, Policy>()) {
      // The epilogue's stores by TMA, a warp's 16 rows a box (the output has a tile or chunks of
      // its own), where rows are whole 16-byte chunks: a bulk tensor store writes whole chunks, so
      // a row of another length would have the columns up to its next 16-byte boundary
      // overwritten (seen on an H200 at Dv 5, where they are the padding of a strided out).
      maps.out_usable = maps.usable && tma_store_enabled() && p.value_dim % 8 == 0 &&
                        encode_rows_map(&maps.out, p.out, p.value_dim, p.seqlen_q, p.heads, p.batch,
                                        p.out_row_stride, p.out_head_stride, p.out_batch_stride,
                                        QTile::kBlockCols, 16, QTile::kSwizzleBytes);
    }
  }
  constexpr auto* kernel = &forward_kernel<T, kD, Policy>;
  cudaError_t e = allow_dynamic_smem<kernel>(smem);
  if (e != cudaSuccess) {
    return Status::backend_error(std::string("fmha: CUDA forward kernel (sm90) could not get ") +
                                 std::to_string(smem) +
                                 " bytes of shared memory: " + cudaGetErrorString(e));
  }
  std::int64_t blocks = (p.seqlen_q + kM - 1) / kM;
  if constexpr (kTokenTiles) {
    blocks = neighborhood::num_block_boxes(p.neighborhood, kM);
    set_token_tiles<FwdTokenTiles<kD, Policy>>(p.neighborhood);
  } else {  // head sections (block_coords.cuh): each block streams its head's K and V
    p.head_section_log2 =
        head_section_log2_for(p, blocks, p.heads, p.seqlen_k * (p.head_dim + p.value_dim) * 2);
  }
  dim3 grid = batch_grid(p, blocks, p.heads);
  if constexpr (kCopyWarpgroup<kD, Policy>) {
    // Persistent blocks walk that grid's tiles (mainloop_fwd.cuh).
    p.tile_grid[0] = grid.x;
    p.tile_grid[1] = grid.y;
    p.tile_grid[2] = grid.z;
    const std::int64_t tiles = std::int64_t{grid.x} * grid.y * grid.z;
    if (tiles >= (std::int64_t{1} << 32)) {
      return Status::backend_error("fmha: CUDA forward kernel (sm90): more than 2^32 query tiles");
    }
    grid = dim3(static_cast<unsigned>(std::min<std::int64_t>(tiles, persistent_blocks())));
    // Tiles of unequal work are taken one by one from a counter (mainloop_fwd.cuh) in the call's
    // scratch memory, zeroed here in stream order.
    p.tile_counter = nullptr;
    if (forward_tiles_dynamic(p) && grid.x < tiles) {
      if (p.scratch == nullptr) {
        return Status::backend_error(
            "fmha: CUDA forward kernel (sm90): no scratch memory for its tile counter (an "
            "internal error: the call's workspace plan missed it)");
      }
      p.tile_counter = static_cast<unsigned*>(p.scratch);
      e = cudaMemsetAsync(p.tile_counter, 0, sizeof(unsigned), stream);
      if (e != cudaSuccess) {
        return Status::backend_error(
            std::string("fmha: CUDA forward kernel (sm90): zeroing its tile counter: ") +
            cudaGetErrorString(e));
      }
    }
  }
  kernel<<<grid, block_threads<kD, Policy>(), smem, stream>>>(p, maps);
  e = cudaGetLastError();
  if (e != cudaSuccess) {
    return Status::backend_error(std::string("fmha: CUDA forward kernel (sm90) launch failed: ") +
                                 cudaGetErrorString(e));
  }
  return Status::ok_status();
}

}  // namespace fmha::cuda::sm90
