// The backward kernels' runtime arguments. The forward's ForwardParams is embedded as is: the
// backward recomputes the forward's scores, so masks and score modifiers are made from it by the
// very policies the forward uses. Its lse pointer and strides hold the forward's lse (read only).
#pragma once

#include <cstdint>

#include "cuda/common/forward_params.h"

namespace fmha::cuda {

struct BackwardParams {
  ForwardParams fwd;
  float scale = 1.0f;  // natural-unit scale; the chain rule's last factor of dq and dk

  // dout [B, Lq, H, Dv] (16-bit), dlse [B, H, Lq] fp32 (nullptr when absent). Varlen: batch
  // strides 0, rows from cu_seqlens, dlse [H, total_q].
  const void* dout = nullptr;
  std::int64_t dout_batch_stride = 0, dout_row_stride = 0, dout_head_stride = 0;
  const float* dlse = nullptr;
  std::int64_t dlse_batch_stride = 0, dlse_head_stride = 0, dlse_row_stride = 0;
  // Every dout and out row starts 16-byte aligned and Dv is whole 16-byte chunks: the
  // preprocess (Delta) reads both 16 bytes at a time.
  bool preprocess_chunks = false;

  // Gradients, written in q's dtype with their own strides; dextra_* / dsinks nullptr when not
  // requested.
  void* dq = nullptr;
  std::int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  void* dk = nullptr;
  std::int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  void* dv = nullptr;
  std::int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
  void* dextra_k = nullptr;
  std::int64_t dextra_k_batch_stride = 0, dextra_k_row_stride = 0, dextra_k_head_stride = 0;
  void* dextra_v = nullptr;
  std::int64_t dextra_v_batch_stride = 0, dextra_v_row_stride = 0, dextra_v_head_stride = 0;
  float* dsinks = nullptr;
  std::int64_t dsinks_stride = 0;
  bool accumulate_dsinks = false;  // add this run's dsinks to the values already there

  // Workspace (fp32, one allocation per call). Per-row statistics [B, H, Lq] (varlen
  // [H, total_q]), row stride 1:
  //   delta     Delta[i] = dot(dout[i], out[i]) - dlse[i]
  //   lse_log2  lse * log2(e); +inf for rows that must contribute nothing (fully masked rows,
  //             whose lse is -inf), so that exp2(s - lse_log2) is exactly 0 there
  //   sink_term P_sink[i] * Delta[i] (only with dsinks)
  float* delta = nullptr;
  float* lse_log2 = nullptr;
  float* sink_term = nullptr;
  std::int64_t stat_batch_stride = 0, stat_head_stride = 0;
  // Rows a head's statistics have (dense only): the queries, and past them up to stat_rows (the
  // warp-specialized sm90 fused kernel copies whole query tiles of them by bulk copies) rows
  // holding lse_log2 = +inf and Delta = 0; 0: the rows end with the queries.
  std::int64_t stat_rows = 0;
  // Fused mode: dQ accumulated in fp32 (sm80: atomics; sm90: bulk reductions); nullptr in split
  // mode (the dQ kernel writes dq directly). The sm80 kernels' layout is by row, [B, H, Lq, D]
  // (varlen [H, total_q, D]): row stride D, column stride 1; the sm90 fused kernel's by column,
  // [B, H, D, Lq'] with Lq' = Lq rounded up to 4 (fused_dq.cuh): row stride 1, column stride Lq'.
  float* dq_accum = nullptr;
  std::int64_t accum_batch_stride = 0, accum_head_stride = 0, accum_row_stride = 0;
  std::int64_t accum_col_stride = 1;
  // The warp-specialized sm90 fused kernel in deterministic mode: one zeroed counter per query
  // tile of its accumulator (tile index = float offset / the tile's floats), counting the key
  // blocks that have added to the tile, so that they add in key-block order
  // (sm90/mainloop_bwd_fused.cuh); nullptr otherwise.
  int* dq_semaphore = nullptr;

  // Bias and rel-pos gradients, accumulated by the dK/dV kernel from dS (the gradient wrt the
  // final score) into zeroed fp32 workspace, then converted into the gradients' dtype and strides.
  // dbias: compact [B, H, Lq, Lk] with size 1 (and stride 0) on the dimensions where dbias
  // broadcasts; those receive the sum. dbias_atomic: some element gets several contributions
  // (a broadcast dimension of size > 1), otherwise each element is stored exactly once.
  float* dbias_accum = nullptr;
  std::int64_t dbias_accum_stride[4] = {0, 0, 0, 0};
  bool dbias_atomic = false;
  // drel_h [B, H, Lq, Hk], drel_w [B, H, Lq, Wk], row-major (Lq: varlen max_seqlen_q), atomics.
  float* drel_h_accum = nullptr;
  float* drel_w_accum = nullptr;
  std::int64_t rel_rows = 0, rel_h_size = 0;
  // The sm90 rel-pos dQ kernel owns every drel_h / drel_w element (each query row's sums are
  // complete in its block): it writes them in place, in the inputs' 16-bit type at the gradients'
  // own strides, instead of an accumulator, its zeroing and a conversion.
  void* drel_h_out = nullptr;
  void* drel_w_out = nullptr;
  std::int64_t drel_h_stride[4] = {0, 0, 0, 0}, drel_w_stride[4] = {0, 0, 0, 0};

  // dK/dV kernel: column chunks of the head dims (tile_sizes_bwd.h), one block each.
  int num_chunks = 1;

  // The sm90 split backward: the dQ kernel is launched to overlap the dK/dV kernel just before it
  // in the stream (programmatic dependent launch; sm90/grid_dependency.cuh).
  bool dq_overlaps_dkdv = false;
};

}  // namespace fmha::cuda
