// Attention over a KV cache, for serving (SPEC §16): decode (Lq = 1), short queries, and prefill or
// chunked prefill over a cache, forward only. Two entry points:
//
//   KvCacheAppendParams   writes new tokens' K/V into the cache at positions cache_seqlens[b] .. ;
//   KvCacheForwardParams  attends q to the first cache_seqlens[b] keys of each sequence.
//
// The append is its own entry point rather than part of the attention call because the attention
// call then only reads the cache: its key blocks can be split over the SMs (split-KV) without any
// block waiting for another block's write, an engine that writes K/V itself (fused with RoPE or
// quantisation) skips it, and the two calls capture into one CUDA graph like any other pair of
// kernels. The caller's cache_seqlens are never modified: after appending Lnew tokens, the engine
// passes cache_seqlens + Lnew to the attention call (fmha.attention_with_kvcache in Python does both).
//
// A cache is contiguous, k_cache [B, Lcache_max, Hkv, D] and v_cache [B, Lcache_max, Hkv, Dv], or
// paged, k_cache [num_pages, page_size, Hkv, D] and v_cache [num_pages, page_size, Hkv, Dv] with a
// block_table [B, max_pages_per_seq] int32: token t of sequence b lives in page block_table[b, t /
// page_size] at row t % page_size. page_size is any value 1..256. Entries of block_table past the
// pages a sequence uses are never read.
//
// Bad data in device memory: block_table and cache_seqlens (and cu_seqlens_q) on a CUDA device are
// not read by the host (that would need a synchronisation). The kernels clamp every length to the
// capacity and every page index to [0, num_pages), so such data gives wrong numbers but never reads
// outside the tensors; the append skips (never clamps) a write whose page or position is out of range.
// The same values on the CPU are checked, and refused with kInvalidArgument.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fmha/params.h"
#include "fmha/status.h"
#include "fmha/tensor.h"

namespace fmha {

// Writes k_new / v_new into the cache: token n of sequence b goes to position cache_seqlens[b] + n.
// k_new [B, Lnew, Hkv, D] and v_new [B, Lnew, Hkv, Dv], or packed [total_new, Hkv, D] / [.., Dv]
// with cu_seqlens_new [B + 1] int32 (sequence b appends rows cu_seqlens_new[b] .. [b + 1] - 1).
// Every position written must lie inside the sequence's capacity (Lcache_max, or max_pages_per_seq
// * page_size). Pages written by different sequences must be distinct (a shared prefix page is only
// ever read). k_cache and v_cache fix the dtype and device.
struct KvCacheAppendParams {
  TensorView k_new = {}, v_new = {};
  TensorView cu_seqlens_new = {};  // optional [B + 1] int32: packed new tokens
  TensorView k_cache = {}, v_cache = {};  // written
  TensorView block_table = {};            // optional [B, max_pages_per_seq] int32: the cache is paged
  TensorView cache_seqlens = {};          // [B] int32: tokens already in the cache, read only
};

// out[b, i] = attention of q[b, i] over keys 0 .. cache_seqlens[b] - 1 of sequence b (SPEC §2-§10).
// q [B, Lq, H, D], out [B, Lq, H, Dv], lse [B, H, Lq]; or packed q [total_q, H, D] with cu_seqlens_q
// [B + 1] int32 and max_seqlen_q, out [total_q, H, Dv], lse [H, total_q] (chunked prefill).
// The queries of sequence b are its last Lq positions, so causal masks and windows are bottom-right:
// options.causal_alignment must be kBottomRight whenever causal or a window is set. Options that
// apply: scale, softcap, causal, window_left / window_right, sinks, deterministic (the kernels are
// deterministic anyway). bias, rel_h / rel_w and extra_k / extra_v are refused. A sequence with no
// key (cache_seqlens[b] = 0) gives out = 0 and lse = -inf (its sink's logit with sinks), per §10.
//
// workspace: on CUDA, decode-sized calls split each sequence's keys over several blocks (split-KV)
// and combine the partial results; the partials live in caller memory of workspace_size() bytes,
// so the call allocates nothing. A smaller workspace (or none) lowers the number of splits, down to
// 1, which needs none; results differ only by summation order. num_splits > 0 asks for that many
// splits (the same limits apply); 0 lets the library choose. On Hopper, prefill-sized calls (128
// query rows or more) run the dense forward kernel over the cache instead, without splits; with
// more query tiles than SMs it takes a small tile counter from the workspace, and with a workspace
// too small for it the call runs the split kernel. The CPU backend needs no workspace.
struct KvCacheForwardParams {
  TensorView q = {};
  TensorView cu_seqlens_q = {};   // optional [B + 1] int32: packed queries
  std::int64_t max_seqlen_q = 0;  // with cu_seqlens_q: the longest query run
  TensorView k_cache = {}, v_cache = {};
  TensorView block_table = {};    // optional [B, max_pages_per_seq] int32: the cache is paged
  TensorView cache_seqlens = {};  // [B] int32: keys of sequence b
  TensorView out = {};
  TensorView lse = {};  // optional output, fp32
  AttentionOptions options = {};
  int num_splits = 0;  // 0: chosen by the library
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

Status check(const KvCacheAppendParams& params);
Status check(const KvCacheForwardParams& params);
Status run(const KvCacheAppendParams& params, void* stream = nullptr);
Status run(const KvCacheForwardParams& params, void* stream = nullptr);

// Bytes of workspace that run(params) uses for its split count on params' device (0 on the CPU and
// when one split suffices). Validates params first (workspace and workspace_bytes are not read).
// Depends only on the shapes, num_splits and the device, never on tensor contents, so it can be
// sized before the lengths are known (CUDA graph capture); a buffer too small only lowers the split count.
Status workspace_size(const KvCacheForwardParams& params, std::size_t* bytes);

}  // namespace fmha
