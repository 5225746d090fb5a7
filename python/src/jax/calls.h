// The JAX front end's calls into the C++ API: operand lists and attributes, as XLA's FFI hands
// them over, turned into one parameter struct per entry point and checked or run.
//
// XLA buffers are dense and row-major, so an operand is a pointer, a dtype and a shape; the
// strides follow, except for bias and rel-pos (and dbias), whose size-1 dimensions get stride 0
// (the broadcast the C++ layer reads, and sums the gradient over).
//
// Operand order of each entry point (python/fmha/jax/_ffi.py builds the same lists):
//   attention / neighborhood forward  args  q, k, v, <optional inputs>
//                                     rets  out, lse
//   varlen forward                    args  q, k, v, cu_seqlens_q, cu_seqlens_k, <optional inputs>
//                                     rets  out, lse
//   every backward                    args  q, k, v, [cu_seqlens_q, cu_seqlens_k], out, lse, dout,
//                                           [dlse], <optional inputs>
//                                     rets  dq, dk, dv, <gradients of the optional inputs asked for>
//   merge forward                     args  outs[n], lses[n]           rets  out, lse
//   merge backward                    args  outs[n], lses[n], out, lse, dout, [dlse]
//                                     rets  douts[n], dlses[n]
// <optional inputs> are those of bias, rel_h, rel_w, sinks, extra_k, extra_v whose bit is set in
// CallAttrs::inputs, in that order; the gradients likewise with CallAttrs::grads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fmha/fmha.h"

namespace fmha::jax {

enum class Entry : std::uint8_t {
  kAttentionForward,
  kAttentionBackward,
  kVarlenForward,
  kVarlenBackward,
  kNeighborhoodForward,
  kNeighborhoodBackward,
  kMergeForward,
  kMergeBackward,
};

// The entry point of a name used by the Python side ("attention_fwd", ...); false if unknown.
bool entry_from_name(std::string_view name, Entry* entry);

// Bits of CallAttrs::inputs and CallAttrs::grads, in operand order.
enum OptionalInput : std::int64_t {
  kBias = 1 << 0,
  kRelH = 1 << 1,
  kRelW = 1 << 2,
  kSinks = 1 << 3,
  kExtraK = 1 << 4,
  kExtraV = 1 << 5,
};
inline constexpr int kNumOptionalInputs = 6;

struct Operand {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
};

// The attributes of every call (each entry point reads the ones it needs).
struct CallAttrs {
  std::int64_t inputs = 0;  // OptionalInput bits: optional inputs present
  std::int64_t grads = 0;   // OptionalInput bits: their gradients asked for (backward)
  bool has_dlse = false;    // backward: dlse present
  bool has_scale = false;
  float scale = 0.0f;
  float softcap = 0.0f;
  bool causal = false;
  bool bottom_right = false;
  std::int64_t window_left = -1, window_right = -1;
  bool deterministic = false;
  bool allow_tf32 = false;
  bool cpu_reference = false;  // CpuBackend::kReference instead of kAuto
  BackwardImpl backward_impl = BackwardImpl::kAuto;
  std::int64_t max_seqlen_q = 0, max_seqlen_k = 0;  // varlen
  NeighborhoodOptions neighborhood;                 // neighborhood
  std::int64_t num_parts = 0;                       // merge
};

// Builds the entry point's parameters from the operands and checks them (check_only), or runs
// them on `stream` (CUDA; ignored on the CPU) with their scratch memory from `workspace` (the
// attention entry points; fmha/params.h). A miscount of operands is an invalid argument naming
// what was expected.
Status call(Entry entry, const Operand* args, std::size_t num_args, const Operand* rets,
            std::size_t num_rets, const CallAttrs& attrs, Device device, void* stream,
            bool check_only, const Workspace& workspace = {});

}  // namespace fmha::jax
