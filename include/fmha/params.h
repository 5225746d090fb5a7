// One parameter struct per entry point. Fill them with designated initialisers:
//
//   fmha::AttentionForwardParams p{.q = q, .k = k, .v = v, .out = out,
//                                  .options = {.causal = true}};
//
// Shapes follow SPEC §1 (docs/semantics.md): q [B, Lq, H, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv],
// out [B, Lq, H, Dv], lse [B, H, Lq] fp32. Any strides are accepted as long as the last dimension has
// stride 1; a stride of 0 broadcasts. Outputs are overwritten, never accumulated into.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "fmha/tensor.h"

namespace fmha {

enum class CausalAlignment : std::uint8_t {
  kTopLeft,      // key j visible to query i iff j <= i
  kBottomRight,  // key j visible to query i iff j <= i + (Lk - Lq)
};

// Which backend runs a call on CPU tensors (SPEC §18); CUDA tensors ignore it.
enum class CpuBackend : std::uint8_t {
  kAuto,       // the fast backend (src/cpu/) for what it covers: dense, varlen and neighborhood
               // calls in fp32 / fp16 / bf16, extra keys, bias and rel-pos too (the
               // dense backward's drel without a broadcast dimension, dbias of any shape; the
               // varlen backward no dbias; neighborhood calls neither); the reference for the rest
  kReference,  // the float64 reference for every call: every feature, slow, the tests' oracle
};

enum class BackwardImpl : std::uint8_t {
  kAuto,   // chosen per problem by a measured rule
  kFused,  // one pass per K/V block, dQ accumulated in fp32
  kSplit,  // a dQ pass and a dK/dV pass
};

// Score modifiers, masks and extra inputs shared by every attention entry point (SPEC §2-§5, §7, §9).
// An optional tensor is "not given" when its rank is 0 (a default-constructed TensorView).
struct AttentionOptions {
  std::optional<float> scale;  // default 1 / sqrt(D)
  float softcap = 0.0f;        // > 0: s = softcap * tanh(s / softcap)
  bool causal = false;
  CausalAlignment causal_alignment = CausalAlignment::kTopLeft;
  std::int64_t window_left = -1;   // -1: unbounded
  std::int64_t window_right = -1;  // -1: unbounded
  TensorView bias = {};     // [B, H, Lq, Lk], any strides, 0 broadcasts
  TensorView rel_h = {};    // [B, H, Lq, Hk]  decomposed 2-D relative-position bias, Lk = Hk * Wk
  TensorView rel_w = {};    // [B, H, Lq, Wk]
  TensorView sinks = {};    // [H] fp32
  TensorView extra_k = {};  // [B, R, Hkv, D]  keys visible to every query, not masked, no bias
  TensorView extra_v = {};  // [B, R, Hkv, Dv]
  bool deterministic = false;  // bitwise-identical results run to run
  bool allow_tf32 = false;     // fp32 inputs only: TF32 tensor cores (SPEC §13 tolerance 2e-3)
  CpuBackend cpu_backend = CpuBackend::kAuto;
  int cpu_threads = 0;  // fast CPU backend: threads to use; 0: FMHA_CPU_THREADS, else every core
};

// Gradients written by every backward entry point. dq, dk, dv are required; each other gradient is
// computed only when given, and may be given only when its input is. A gradient has its input's
// shape and dtype (dsinks: fp32). dbias must be zero-strided exactly where bias is: broadcast
// dimensions receive the sum over them (SPEC §4).
struct AttentionGradients {
  TensorView dq = {}, dk = {}, dv = {};
  TensorView dbias = {}, drel_h = {}, drel_w = {};
  TensorView dsinks = {};
  TensorView dextra_k = {}, dextra_v = {};
};

// Scratch memory of a call on a CUDA device: the backward's fp32 row statistics and accumulators
// (dQ, dbias, drel), the fp32 kernels' operand planes, the forward's tile counter under a mask.
// fmha::workspace_size(params) gives the bytes a call takes at most (0 on the CPU, and for most
// 16-bit forward calls). Where they come from, the first that is set:
//   data      the caller's memory, at least workspace_size bytes (`bytes` says how many it has),
//             16-byte aligned, not touched by other work while the call's work runs on its stream:
//             the call allocates nothing;
//   allocate  called by run(), before it queues any work, with the bytes it needs (at most
//             workspace_size; not called when it needs none); returns device memory on the call's
//             device, 16-byte aligned, that stays valid for the work the call queues on its stream
//             (freed after run() returns, in that stream's order, as PyTorch's caching allocator
//             and XLA's scratch allocator do), or nullptr, which fails the call (backend_error)
//             with nothing written;
//   neither   fmha's own stream-ordered pool (cudaMallocAsync), given back in stream order.
// The CPU backend ignores it.
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
  void* (*allocate)(void* context, std::size_t bytes) = nullptr;
  void* context = nullptr;
};

// ---- Dense attention --------------------------------------------------------------------------

struct AttentionForwardParams {
  TensorView q = {}, k = {}, v = {};
  TensorView out = {};
  TensorView lse = {};  // optional output, [B, H, Lq] fp32
  AttentionOptions options = {};
  Workspace workspace = {};
};

struct AttentionBackwardParams {
  TensorView q = {}, k = {}, v = {};
  TensorView out = {}, lse = {};  // from the forward pass (lse required)
  TensorView dout = {};
  TensorView dlse = {};  // optional, [B, H, Lq] fp32: the gradient flowing into lse
  AttentionOptions options = {};
  BackwardImpl backward_impl = BackwardImpl::kAuto;
  AttentionGradients grads = {};
  Workspace workspace = {};
};

// ---- Variable-length packed batches (SPEC §8) ----------------------------------------------------
// q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv], out [total_q, H, Dv], lse [H, total_q].
// cu_seqlens_* are [B + 1] int32 on the same device as q. Sequence b owns rows
// cu_seqlens[b] .. cu_seqlens[b + 1] - 1; masks use positions inside the sequence.
// bias is [B, H, max_seqlen_q, max_seqlen_k], indexed by positions inside the sequence.
// rel_h / rel_w are refused (a packed batch has no common key grid).
// CPU offsets are always checked (ascending from 0, the last equal to the row count, no sequence
// longer than max_seqlen). CUDA offsets are not read on the host unless check_cu_seqlens is set:
// the kernels clamp every offset to the tensors' extents, so bad device offsets give wrong
// numbers, never an access outside the tensors. check_cu_seqlens = true copies them to the host
// and checks them like CPU ones before anything runs: a synchronisation of the stream (not
// allowed while a CUDA graph is being captured).

struct VarlenForwardParams {
  TensorView q = {}, k = {}, v = {};
  TensorView cu_seqlens_q = {}, cu_seqlens_k = {};
  std::int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  bool check_cu_seqlens = false;  // CUDA: check the offsets on the host (a sync; see above)
  TensorView out = {};
  TensorView lse = {};  // optional output, [H, total_q] fp32
  AttentionOptions options = {};
  Workspace workspace = {};
};

struct VarlenBackwardParams {
  TensorView q = {}, k = {}, v = {};
  TensorView cu_seqlens_q = {}, cu_seqlens_k = {};
  std::int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  bool check_cu_seqlens = false;  // CUDA: check the offsets on the host (a sync; see above)
  TensorView out = {}, lse = {};
  TensorView dout = {};
  TensorView dlse = {};  // optional, [H, total_q] fp32
  AttentionOptions options = {};
  BackwardImpl backward_impl = BackwardImpl::kAuto;
  AttentionGradients grads = {};
  Workspace workspace = {};
};

// ---- Neighborhood attention (SPEC §6) -------------------------------------------------------------
// q, k [B, X1, (X2, (X3)), H(kv), D], v [B, X..., Hkv, Dv], out [B, X..., H, Dv], lse [B, H, X...].
// options.causal and the window must stay unset (per-axis causality lives here); every other option
// (scale, softcap, bias and rel-pos over the flattened grid, sinks, extra keys) applies.

struct NeighborhoodOptions {
  int num_dims = 1;  // 1, 2 or 3
  std::array<std::int64_t, 3> kernel_size{1, 1, 1};
  std::array<std::int64_t, 3> dilation{1, 1, 1};
  std::array<bool, 3> causal{false, false, false};
};

struct NeighborhoodForwardParams {
  TensorView q = {}, k = {}, v = {};
  TensorView out = {};
  TensorView lse = {};  // optional output
  NeighborhoodOptions neighborhood = {};
  AttentionOptions options = {};
  Workspace workspace = {};
};

struct NeighborhoodBackwardParams {
  TensorView q = {}, k = {}, v = {};
  TensorView out = {}, lse = {};
  TensorView dout = {};
  TensorView dlse = {};  // optional
  NeighborhoodOptions neighborhood = {};
  AttentionOptions options = {};
  BackwardImpl backward_impl = BackwardImpl::kAuto;
  AttentionGradients grads = {};
  Workspace workspace = {};
};

// ---- Merging partial attentions (SPEC §12) --------------------------------------------------------
// Each part: out [B, Lq, H, Dv] (fp32/fp16/bf16, all the same dtype), lse [B, H, Lq] fp32.

struct MergeForwardParams {
  std::vector<TensorView> outs = {}, lses = {};
  TensorView out = {}, lse = {};
};

struct MergeBackwardParams {
  std::vector<TensorView> outs = {}, lses = {};
  TensorView out = {}, lse = {};  // the merged result
  TensorView dout = {};
  TensorView dlse = {};  // optional
  std::vector<TensorView> douts = {}, dlses = {};  // one per part, shapes of outs / lses
};

}  // namespace fmha
