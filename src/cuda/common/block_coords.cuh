// Which (batch, head, tile) of the grid a block owns. The grid is (tiles, heads, batch), or, with
// ForwardParams::batch_innermost, (tiles * batch, heads, 1) with the batch varying fastest: the
// blocks that read the same tile of a bias shared by every batch ([1, H, L, L]) then run at the
// same time and find it in L2, instead of reading it from memory once per batch. The sm90
// backward kernels use it (H100, SAM-B [1, H, L, L] bias: dbias backward 79 -> 117 TFLOP/s, its
// atomic sums over the batch then meet in L2; a fixed bias 177 -> 181), and the forward's
// register-form bias (PolicyBias), for its memory traffic: SAM-B forward 1.55 ms either way on
// an H100, where the batch outermost reads the bias from memory 8 times; not the forward's general
// policy (the decoding cost it 80 bytes more spill at D 128).
//
// Otherwise the blocks of a batch start in sections of 2^ForwardParams::head_section_log2 heads: a
// section's blocks by tile, its heads interleaved within a tile (grid (tiles << log2, heads >>
// log2, batch), decoded by shifts of the block index, which the compiler recomputes where it needs
// them instead of holding registers: a general decode with divisions spilled the D 128 forward and
// dK/dV kernels). Under a causal mask the tiles' work runs from most to least within a head (the
// kernels map tiles so), and head by head the last head's heaviest blocks start when most of the
// grid is done: at 16 heads of 64 tiles, list scheduling over 132 SMs ends 11% later than with
// sections of two heads, which come within 1% of the ideal (H200, 2026-11-26). Sections stay small (two
// heads, more while the operand every block of a head streams, K / V or Q / dO, fits a share of
// L2) and are used under causal masks only (head_section_log2_for).
#pragma once

#include <cstdint>

#include "cuda/common/env_switch.h"
#include "cuda/common/forward_params.h"

namespace fmha::cuda {

struct BlockCoords {
  std::int64_t batch, tile, tiles;  // tile in [0, tiles)
  int head;                         // of the grid's heads (the kv heads for the dK/dV kernels)
};

// kBatchInnermost: whether the kernel's policy may run the batch innermost (the branch alone cost
// the D 128 forward's general policy 100 bytes more spill).
// `index` is the block's place in a grid of `dims` (blockIdx, gridDim; or a persistent block's
// current tile of the grid it walks, tile_index below). Host-callable for the host tests.
template <bool kBatchInnermost>
__host__ __device__ __forceinline__ BlockCoords block_coords(const ForwardParams& f, uint3 index,
                                                             dim3 dims) {
  if constexpr (kBatchInnermost) {
    if (f.batch_innermost) {
      const unsigned batch = static_cast<unsigned>(f.batch);  // a grid dimension's worth at most
      return {index.x % batch, index.x / batch, dims.x / batch, static_cast<int>(index.y)};
    }
  }
  const unsigned log2 = static_cast<unsigned>(f.head_section_log2);
  return {index.z, index.x >> log2, dims.x >> log2,
          static_cast<int>((index.y << log2) | (index.x & ((1u << log2) - 1u)))};
}

// Where batch b's query and key rows start in q / k (varlen: packed sequences, from cu_seqlens;
// 0 in a dense batch, whose batch stride does the rest) and how many there are.
//
// cu_seqlens live on the device and are never read on the host (that would cost a sync), so the
// values read here may be anything. Each is clamped so that the rows stay inside the tensors
// whatever they hold: a start to [0, total rows], an end to [start, total rows] (a decreasing
// pair is an empty sequence), and a length to max_seqlen, which sized the grid and the
// [B, H, max_seqlen_q, max_seqlen_k] bias and workspace rows. Valid offsets pass unchanged; bad
// ones give wrong numbers at worst, never an access outside q, k, v, out, lse or the gradients.
// A KV cache's length (seqused_k) is clamped to [0, seqlen_k], its capacity, the same way.
struct SequenceRows {
  std::int64_t q_start, k_start, num_queries, num_keys;
};
struct RowSpan {
  std::int64_t start, count;
};
__host__ __device__ __forceinline__ RowSpan clamped_rows(const std::int32_t* cu, std::int64_t b,
                                                         std::int64_t total,
                                                         std::int64_t longest) {
  std::int64_t start = cu[b], end = cu[b + 1];
  start = start < 0 ? 0 : (start > total ? total : start);
  end = end < start ? start : (end > total ? total : end);
  const std::int64_t count = end - start;
  return {start, count < longest ? count : longest};
}
__host__ __device__ __forceinline__ SequenceRows sequence_rows(const ForwardParams& f,
                                                               std::int64_t b) {
  if (f.cu_seqlens_q == nullptr && f.seqused_k == nullptr) return {0, 0, f.seqlen_q, f.seqlen_k};
  const RowSpan q = f.cu_seqlens_q != nullptr
                        ? clamped_rows(f.cu_seqlens_q, b, f.total_q, f.seqlen_q)
                        : RowSpan{0, f.seqlen_q};
  if (f.seqused_k != nullptr) {  // a KV cache's first keys, in the batch's own rows
    const std::int64_t used = f.seqused_k[b * f.seqused_k_stride];
    return {q.start, 0, q.count, used < 0 ? 0 : (used > f.seqlen_k ? f.seqlen_k : used)};
  }
  const RowSpan k = clamped_rows(f.cu_seqlens_k, b, f.total_k, f.seqlen_k);
  return {q.start, k.start, q.count, k.count};
}

// Tile `linear` of a grid of `dims` blocks, x fastest: the order in which the hardware starts the
// blocks of such a grid, which a persistent block walks instead (sm90 forward).
__host__ __device__ __forceinline__ uint3 tile_index(unsigned linear, dim3 dims) {
  const unsigned rest = linear / dims.x;
  return make_uint3(linear - rest * dims.x, rest % dims.y, rest / dims.y);
}

#ifdef __CUDACC__
template <bool kBatchInnermost>
__device__ __forceinline__ BlockCoords block_coords(const ForwardParams& f) {
  return block_coords<kBatchInnermost>(f, blockIdx, gridDim);
}
#endif

// The grid of `tiles` x `heads` blocks a batch, in the order block_coords reads.
inline dim3 batch_grid(const ForwardParams& f, std::int64_t tiles, std::int64_t heads) {
  if (f.batch_innermost) {
    return dim3(static_cast<unsigned>(tiles * f.batch), static_cast<unsigned>(heads), 1);
  }
  return dim3(static_cast<unsigned>(tiles << f.head_section_log2),
              static_cast<unsigned>(heads >> f.head_section_log2), static_cast<unsigned>(f.batch));
}

// head_section_log2 for a grid of `tiles` x `heads` blocks a batch whose blocks each stream
// `bytes_per_head` of their head (all of K and V, or of Q and dO). Only where a block's work
// follows its tile, i.e. a window open on one side only (causal), and a head has 8 tiles or more;
// there sections of 2 wherever the heads are even, doubled up to 8 while the section's bytes stay
// within 16 MiB of L2. Two heads give most of the balance, and the blocks of a head read its stream
// in step, not all at once: GQA H32 / Hkv8 D128 L8192 causal, whose dK/dV kernel streams 16 MiB a
// kv head, ran its backward 4.5% slower than the same query shape without GQA when that kernel went
// head by head (H200, 2026-11-26). Elsewhere head by head: with equal blocks sections balance
// nothing, and against head-by-head order in one run (H200, 2026-11-26) they cost up to 2%
// on long non-causal rows (D 128 L 8192 backward) and widened the spread of some L 512 cells (4
// tiles a head), where they gained 2-11% on causal L 2048 / 8192 (D 64 / 128 / 256).
// FMHA_HEAD_SECTIONS=0 in the environment keeps head-by-head order (read once; for measuring).
inline int head_section_log2_for(const ForwardParams& f, std::int64_t tiles, std::int64_t heads,
                                 std::int64_t bytes_per_head) {
  static const bool off = switched_off_by_env("FMHA_HEAD_SECTIONS");
  const bool one_sided =
      (f.window_left == kUnboundedWindow) != (f.window_right == kUnboundedWindow);
  if (off || !one_sided || tiles < 8) return 0;
  if (heads % 2 != 0) return 0;
  constexpr std::int64_t kBudget = std::int64_t{16} << 20;
  int log2 = 1;
  while (log2 < 3 && heads % (std::int64_t{2} << log2) == 0 &&
         (std::int64_t{2} << log2) * bytes_per_head <= kBudget) {
    ++log2;
  }
  return log2;
}

// The warp-specialized D 256 backward's walk over a block's steps (mainloop_bwd_fused_d256.cuh):
// every query tile of its key block (`count` of them) for each query head of its group in turn,
// each head's tiles starting at the block's first tile and wrapping around. Blocks of neighbouring
// key tiles start at different query tiles, so that the blocks running at once add their dQ to
// different parts of the accumulator instead of all to the same rows: 2-6% faster from L 2048 on,
// 1-2% causal, level at L 512 (H200, bf16, 16k tokens, 2026-11-28,
// bench/cpp/sm90_fused_d256_timing.cu).
struct QueryWalk {
  int head, m_tile, walked;
  // Back at the first tile after each head's `count` steps.
  __host__ __device__ __forceinline__ void advance(int count) {
    if (++m_tile == count) m_tile = 0;
    if (++walked == count) walked = 0, ++head;
  }
};

// Whether the bias is one for every batch of a dense batch (the case batch_innermost is for).
inline bool bias_shared_by_batches(const ForwardParams& f) {
  return f.bias != nullptr && f.bias_stride[0] == 0 && f.batch > 1 && f.cu_seqlens_q == nullptr;
}

}  // namespace fmha::cuda
