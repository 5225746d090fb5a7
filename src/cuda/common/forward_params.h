// The forward kernels' runtime arguments: plain data filled on the host by the launch code from
// validated tensor views, read on the device. Every stride is in elements and 64-bit; every size
// that is not a compile-time tile dimension is a runtime value here.
#pragma once

#include <cstdint>

namespace fmha::cuda {

// Window bound meaning "unbounded": far past any sequence length, small enough that adding a
// position to it cannot overflow int64.
inline constexpr std::int64_t kUnboundedWindow = std::int64_t{1} << 60;

// Neighborhood attention (SPEC §6): the row-major token grid with its per-axis kernel size,
// dilation and causality. 32-bit, because the host refuses grids of 2^31 tokens or more: the
// per-element visibility test then stays in 32-bit integer arithmetic.
struct NeighborhoodGrid {
  int rank = 0;             // 1..3; 0 for every other layout
  int size[3] = {1, 1, 1};  // X_r; axes past rank hold 1
  int kernel[3] = {1, 1, 1};
  int dilation[3] = {1, 1, 1};
  bool causal[3] = {false, false, false};
  // The box shapes of the token-tile kernel about to run (neighborhood_mask.cuh: block_box_shape,
  // seen_box_shape), found once on the host by its launcher (set_box_shapes) instead of by one
  // thread of every block while the others wait; 0: block_tiles searches them itself.
  int box_shape[3] = {0, 0, 0};
  int seen_shape[3] = {0, 0, 0};
  // The bit-mask window test's prefix tables for boxes of seen_shape of column_tiles n8 tiles
  // (neighborhood_mask.cuh: column_prefix_tables), filled by set_box_shapes beside the shapes, so
  // that every block copies them instead of computing them; column_tiles 0: not filled. The
  // blocks read them without checking column_tiles: the sm90 launchers fill them through
  // set_token_tiles (token_tiles.cuh), whose width is the kernel's own.
  static constexpr int kMaxColumnEntries = 8 * 16 + 5;  // boxes of up to 128 entries
  int column_tiles = 0;
  unsigned column_bits[4][kMaxColumnEntries] = {};
};

struct ForwardParams {
  // q [B, Lq, H, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv], out [B, Lq, H, Dv] (elements of q's
  // dtype: fp16, bf16 or fp32).
  // Varlen: batch strides are 0 and rows start at cu_seqlens[b].
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  std::int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  std::int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  std::int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  std::int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;

  // lse [B, H, Lq] fp32 (varlen: [H, total_q]); nullptr when not requested.
  float* lse = nullptr;
  std::int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;

  // Varlen: [B + 1] int32 on the device; nullptr for dense batches. Never read on the host: the
  // kernels clamp what they read to total_q / total_k and the max_seqlen (sequence_rows,
  // block_coords.cuh).
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;
  std::int64_t total_q = 0, total_k = 0;  // varlen: the rows of q and of k / v; dense: unused

  // Attention over a KV cache (kv_cache.h, run on the sm90 forward by kv_cache_forward.cu): the
  // keys of batch b are the first seqused_k[b * seqused_k_stride] rows of its cache, clamped to
  // [0, seqlen_k] (the capacity); nullptr: seqlen_k keys, or cu_seqlens_k. With a block table the
  // cache is paged: key t of batch b is row t % page_size of page block_table[b *
  // table_batch_stride + (t / page_size) * table_page_stride], clamped to [0, num_pages), and k / v
  // point at page 0 (pages page_size rows apart, k_batch_stride 0). Device data, never read on the
  // host. The sm90 kernel only (its cp.async copies gather the rows: sm90/mainloop_fwd.cuh).
  const std::int32_t* seqused_k = nullptr;
  std::int64_t seqused_k_stride = 0;
  const std::int32_t* block_table = nullptr;
  std::int64_t table_batch_stride = 0, table_page_stride = 0;
  int page_size = 0;
  int page_shift = -1;  // log2(page_size) where it is a power of two, else -1
  std::int64_t num_pages = 0;

  std::int64_t batch = 0;
  std::int64_t seqlen_q = 0;  // dense: Lq; varlen: max_seqlen_q (sizes the grid)
  std::int64_t seqlen_k = 0;  // dense: Lk; varlen: max_seqlen_k (bounds every sequence's keys)
  int heads = 0;
  int kv_group = 1;  // H / Hkv: query head h reads kv head h / kv_group
  int head_dim = 0;
  int value_dim = 0;

  // True when every q/k/v/extra row starts 16-byte aligned and D, Dv are multiples of 16 bytes
  // (8 16-bit elements, 4 floats), so tiles load with 16-byte cp.async; otherwise element by
  // element.
  bool vector_loads = false;
  // True when every out row starts 16-byte aligned and Dv is a multiple of 16 bytes.
  bool vector_stores = false;

  // fp32 only (SPEC §13): one tf32 product per tensor-core step instead of the exact 3xTF32 split.
  bool allow_tf32 = false;

  // Scores: s = scale * q.k, then softcap, then bias and rel-pos. Kept in log2 units.
  float scale_log2 = 0;          // scale * log2(e)
  float softcap_log2 = 0;        // softcap * log2(e); 0 disables softcap
  float scale_over_softcap = 0;  // scale / softcap

  // Masks (SPEC §3): visible iff d(i) - left <= j <= d(i) + right, d(i) = i + offset, where
  // offset = Lk - Lq for bottom-right alignment. Unbounded sides hold kUnboundedWindow.
  bool bottom_right = false;
  std::int64_t window_left = kUnboundedWindow;
  std::int64_t window_right = kUnboundedWindow;
  // Neighborhood attention on one axis without dilation (neighborhood.cu): the window keeps its
  // width left + right + 1 at the borders, its first key clamped to [0, Lk - width] (SPEC §6).
  bool window_shifts_at_borders = false;

  // Additive bias [B, H, Lq, Lk], any strides (0 broadcasts); nullptr when not given.
  const void* bias = nullptr;
  std::int64_t bias_stride[4] = {0, 0, 0, 0};
  // Decomposed relative position: rel_h [B, H, Lq, Hk], rel_w [B, H, Lq, Wk]; nullptr when absent.
  const void* rel_h = nullptr;
  const void* rel_w = nullptr;
  std::int64_t rel_h_stride[4] = {0, 0, 0, 0};
  std::int64_t rel_w_stride[4] = {0, 0, 0, 0};
  std::int64_t rel_w_size = 1;  // Wk: key j sits at (j / Wk, j % Wk)
  // Row pitch (16-bit elements) of the rel_h | rel_w rows a kernel stages in shared memory for its
  // block of queries; 0 when they are read from global memory (kernels that do not stage, rows
  // too long for the shared memory left, or 2^31 keys or more).
  int rel_staged_pitch = 0;
  // True when a kernel stages bias tiles in shared memory next to its K/V tiles (cp.async): keys
  // contiguous, rows and the (b, h) offsets 16-byte aligned, Lk a multiple of 8 (dense only).
  bool bias_staged = false;
  // Grid order (block_coords.cuh): the batch varies fastest, within grid.x.
  bool batch_innermost = false;
  // Grid order (block_coords.cuh): the heads of a batch in sections of 2^head_section_log2, the
  // tiles of a section's heads interleaved (tile slowest); 0 is head by head.
  int head_section_log2 = 0;
  // The grid of tiles, (x, y, z) in block_coords' order, that a persistent kernel's blocks walk
  // (the sm90 forward with a copy warpgroup, whose launch grid is 1-D and at most one block an SM);
  // unused by the kernels whose launch grid is the tiles themselves.
  unsigned tile_grid[3] = {0, 0, 0};
  // Zeroed by the launcher when those blocks take their tiles dynamically (tiles of unequal work);
  // nullptr: round robin.
  unsigned* tile_counter = nullptr;

  // Sinks [H] fp32; nullptr when absent.
  const float* sinks = nullptr;
  std::int64_t sinks_stride = 0;

  // Extra keys [B, R, Hkv, D] / [B, R, Hkv, Dv], after the Lk keys; num_extra = 0 when absent.
  const void* extra_k = nullptr;
  const void* extra_v = nullptr;
  std::int64_t num_extra = 0;
  std::int64_t extra_k_batch_stride = 0, extra_k_row_stride = 0, extra_k_head_stride = 0;
  std::int64_t extra_v_batch_stride = 0, extra_v_row_stride = 0, extra_v_head_stride = 0;

  // Neighborhood attention over the flattened grid (rows and keys are token indices); rank 0
  // otherwise.
  NeighborhoodGrid neighborhood;

  // Host side: the call's scratch memory that its launcher may use (forward.cu / backward.cu size
  // it): the sm90 forward's tile counter, the sm90 fp32 kernels' operand planes. Kernels read
  // tile_counter and their planes, never this.
  void* scratch = nullptr;
};

}  // namespace fmha::cuda
