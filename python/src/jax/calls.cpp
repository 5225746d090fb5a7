#include "jax/calls.h"

#include <string>
#include <type_traits>
#include <utility>

namespace fmha::jax {

namespace {

// Reads operands in order and hands out their views; reading past the end records a miscount,
// which call() reports once, instead of every reader checking.
class Cursor {
 public:
  Cursor(const Operand* operands, std::size_t count, Device device, const char* what)
      : operands_(operands), count_(count), device_(device), what_(what) {}

  // The next operand's view: row-major strides, or stride 0 on size-1 dimensions (broadcast).
  TensorView next(bool broadcast = false) {
    if (position_ >= count_) {
      ++position_;  // counted, so the message can say how many were wanted
      return TensorView{};
    }
    const Operand& o = operands_[position_++];
    std::array<std::int64_t, kMaxRank> stride{};
    std::int64_t running = 1;
    for (int d = o.rank - 1; d >= 0; --d) {
      const auto i = static_cast<std::size_t>(d);
      stride[i] = broadcast && o.shape[i] == 1 ? 0 : running;
      running *= o.shape[i] > 0 ? o.shape[i] : 1;
    }
    return TensorView::strided(o.data, o.dtype, o.rank, o.shape.data(), stride.data(), device_);
  }

  Status finish() const {
    if (position_ == count_) return Status::ok_status();
    return Status::invalid_argument("fmha.jax: the call has " + std::to_string(count_) + " " +
                                    what_ + " but its attributes describe " +
                                    std::to_string(position_) +
                                    " (the Python side and the FFI handler disagree)");
  }

 private:
  const Operand* operands_;
  std::size_t count_;
  std::size_t position_ = 0;
  Device device_;
  const char* what_;
};

AttentionOptions options_of(const CallAttrs& a, Cursor& args) {
  AttentionOptions o;
  if (a.has_scale) o.scale = a.scale;
  o.softcap = a.softcap;
  o.causal = a.causal;
  o.causal_alignment = a.bottom_right ? CausalAlignment::kBottomRight : CausalAlignment::kTopLeft;
  o.window_left = a.window_left;
  o.window_right = a.window_right;
  o.deterministic = a.deterministic;
  o.allow_tf32 = a.allow_tf32;
  o.cpu_backend = a.cpu_reference ? CpuBackend::kReference : CpuBackend::kAuto;
  if (a.inputs & kBias) o.bias = args.next(/*broadcast=*/true);
  if (a.inputs & kRelH) o.rel_h = args.next(/*broadcast=*/true);
  if (a.inputs & kRelW) o.rel_w = args.next(/*broadcast=*/true);
  if (a.inputs & kSinks) o.sinks = args.next();
  if (a.inputs & kExtraK) o.extra_k = args.next();
  if (a.inputs & kExtraV) o.extra_v = args.next();
  return o;
}

AttentionGradients gradients_of(const CallAttrs& a, Cursor& rets) {
  AttentionGradients g;
  g.dq = rets.next();
  g.dk = rets.next();
  g.dv = rets.next();
  // Only gradients of inputs that are present: the C++ check refuses a gradient without input.
  const std::int64_t asked = a.grads & a.inputs;
  if (asked & kBias) g.dbias = rets.next(/*broadcast=*/true);
  if (asked & kRelH) g.drel_h = rets.next();
  if (asked & kRelW) g.drel_w = rets.next();
  if (asked & kSinks) g.dsinks = rets.next();
  if (asked & kExtraK) g.dextra_k = rets.next();
  if (asked & kExtraV) g.dextra_v = rets.next();
  return g;
}

template <typename Params>
Status check_or_run(const Params& p, const Cursor& args, const Cursor& rets, void* stream,
                    bool check_only) {
  FMHA_RETURN_IF_ERROR(args.finish());
  FMHA_RETURN_IF_ERROR(rets.finish());
  return check_only ? check(p) : run(p, stream);
}

// The three shaped layouts share their forward and backward; only these fields differ.
void fill_layout(VarlenForwardParams& p, const CallAttrs& a, Cursor& args) {
  p.cu_seqlens_q = args.next();
  p.cu_seqlens_k = args.next();
  p.max_seqlen_q = a.max_seqlen_q;
  p.max_seqlen_k = a.max_seqlen_k;
}
void fill_layout(VarlenBackwardParams& p, const CallAttrs& a, Cursor& args) {
  p.cu_seqlens_q = args.next();
  p.cu_seqlens_k = args.next();
  p.max_seqlen_q = a.max_seqlen_q;
  p.max_seqlen_k = a.max_seqlen_k;
}
template <typename Params>
void fill_layout(Params& p, const CallAttrs& a, Cursor&) {
  if constexpr (std::is_same_v<Params, NeighborhoodForwardParams> ||
                std::is_same_v<Params, NeighborhoodBackwardParams>) {
    p.neighborhood = a.neighborhood;
  }
}

template <typename Params>
Status forward(const CallAttrs& a, Cursor& args, Cursor& rets, void* stream, bool check_only,
               const Workspace& workspace) {
  Params p;
  p.workspace = workspace;
  p.q = args.next();
  p.k = args.next();
  p.v = args.next();
  fill_layout(p, a, args);
  p.options = options_of(a, args);
  p.out = rets.next();
  p.lse = rets.next();
  return check_or_run(p, args, rets, stream, check_only);
}

template <typename Params>
Status backward(const CallAttrs& a, Cursor& args, Cursor& rets, void* stream, bool check_only,
                const Workspace& workspace) {
  Params p;
  p.workspace = workspace;
  p.q = args.next();
  p.k = args.next();
  p.v = args.next();
  fill_layout(p, a, args);
  p.out = args.next();
  p.lse = args.next();
  p.dout = args.next();
  if (a.has_dlse) p.dlse = args.next();
  p.options = options_of(a, args);
  p.backward_impl = a.backward_impl;
  p.grads = gradients_of(a, rets);
  return check_or_run(p, args, rets, stream, check_only);
}

Status merge_forward(const CallAttrs& a, Cursor& args, Cursor& rets, void* stream,
                     bool check_only) {
  MergeForwardParams p;
  for (std::int64_t i = 0; i < a.num_parts; ++i) p.outs.push_back(args.next());
  for (std::int64_t i = 0; i < a.num_parts; ++i) p.lses.push_back(args.next());
  p.out = rets.next();
  p.lse = rets.next();
  return check_or_run(p, args, rets, stream, check_only);
}

Status merge_backward(const CallAttrs& a, Cursor& args, Cursor& rets, void* stream,
                      bool check_only) {
  MergeBackwardParams p;
  for (std::int64_t i = 0; i < a.num_parts; ++i) p.outs.push_back(args.next());
  for (std::int64_t i = 0; i < a.num_parts; ++i) p.lses.push_back(args.next());
  p.out = args.next();
  p.lse = args.next();
  p.dout = args.next();
  if (a.has_dlse) p.dlse = args.next();
  for (std::int64_t i = 0; i < a.num_parts; ++i) p.douts.push_back(rets.next());
  for (std::int64_t i = 0; i < a.num_parts; ++i) p.dlses.push_back(rets.next());
  return check_or_run(p, args, rets, stream, check_only);
}

}  // namespace

bool entry_from_name(std::string_view name, Entry* entry) {
  static constexpr std::pair<std::string_view, Entry> kNames[] = {
      {"attention_fwd", Entry::kAttentionForward},
      {"attention_bwd", Entry::kAttentionBackward},
      {"varlen_fwd", Entry::kVarlenForward},
      {"varlen_bwd", Entry::kVarlenBackward},
      {"neighborhood_fwd", Entry::kNeighborhoodForward},
      {"neighborhood_bwd", Entry::kNeighborhoodBackward},
      {"merge_fwd", Entry::kMergeForward},
      {"merge_bwd", Entry::kMergeBackward},
  };
  for (const auto& [n, e] : kNames) {
    if (n == name) {
      *entry = e;
      return true;
    }
  }
  return false;
}

Status call(Entry entry, const Operand* args, std::size_t num_args, const Operand* rets,
            std::size_t num_rets, const CallAttrs& attrs, Device device, void* stream,
            bool check_only, const Workspace& workspace) {
  Cursor in(args, num_args, device, "operands");
  Cursor out(rets, num_rets, device, "results");
  switch (entry) {
    case Entry::kAttentionForward:
      return forward<AttentionForwardParams>(attrs, in, out, stream, check_only, workspace);
    case Entry::kAttentionBackward:
      return backward<AttentionBackwardParams>(attrs, in, out, stream, check_only, workspace);
    case Entry::kVarlenForward:
      return forward<VarlenForwardParams>(attrs, in, out, stream, check_only, workspace);
    case Entry::kVarlenBackward:
      return backward<VarlenBackwardParams>(attrs, in, out, stream, check_only, workspace);
    case Entry::kNeighborhoodForward:
      return forward<NeighborhoodForwardParams>(attrs, in, out, stream, check_only, workspace);
    case Entry::kNeighborhoodBackward:
      return backward<NeighborhoodBackwardParams>(attrs, in, out, stream, check_only, workspace);
    case Entry::kMergeForward: return merge_forward(attrs, in, out, stream, check_only);
    case Entry::kMergeBackward: return merge_backward(attrs, in, out, stream, check_only);
  }
  return Status::invalid_argument("fmha.jax: unknown entry point " +
                                  std::to_string(static_cast<int>(entry)));
}

}  // namespace fmha::jax
