#include "api/validate_attention.h"

#include <cmath>
#include <cstddef>

#include "api/validate_message.h"

namespace fmha::detail {
namespace {

// Head dims every backend accepts (SPEC §1).
constexpr std::int64_t kMaxHeadDim = 256;

constexpr const char* kGridAxisNames[3] = {"X1", "X2", "X3"};
// The flattened neighborhood grid, as bias and rel-pos see it (one name per grid rank).
constexpr const char* kFlatGridNames[3] = {"X1", "X1*X2", "X1*X2*X3"};

// The token dimensions before [H, D]: [B, Lq] / [total_q] / [B, X1, ...]; likewise for keys.
Shape token_dims(const ProblemShape& s, bool keys) {
  switch (s.layout) {
    case Layout::kDense:
      return {{"B", s.batch}, keys ? Dim{"Lk", s.seqlen_k} : Dim{"Lq", s.seqlen_q}};
    case Layout::kVarlen:
      return {keys ? Dim{"total_k", s.total_k} : Dim{"total_q", s.total_q}};
    case Layout::kNeighborhood: {
      Shape dims{{"B", s.batch}};
      for (int r = 0; r < s.grid_rank; ++r) {
        dims.push_back({kGridAxisNames[r], s.grid[static_cast<std::size_t>(r)]});
      }
      return dims;
    }
  }
  return {};
}

Shape with(Shape dims, std::initializer_list<Dim> tail) {
  dims.insert(dims.end(), tail);
  return dims;
}

// [B, H, Lq, last]: the score-shaped prefix of bias and rel-pos, with the query axis named as
// each layout indexes it (varlen: positions inside a sequence; neighborhood: the flattened grid).
Shape score_rows(const ProblemShape& s, Dim last) {
  const char* rows = s.layout == Layout::kVarlen         ? "max_seqlen_q"
                     : s.layout == Layout::kNeighborhood ? kFlatGridNames[s.grid_rank - 1]
                                                         : "Lq";
  return {{"B", s.batch}, {"H", s.heads}, {rows, s.seqlen_q}, last};
}

Shape bias_shape(const ProblemShape& s) {
  const char* cols = s.layout == Layout::kVarlen         ? "max_seqlen_k"
                     : s.layout == Layout::kNeighborhood ? kFlatGridNames[s.grid_rank - 1]
                                                         : "Lk";
  return score_rows(s, {cols, s.seqlen_k});
}
Shape rel_h_shape(const ProblemShape& s) {
  return score_rows(s, {"Hk", s.rel_h_size});
}
Shape rel_w_shape(const ProblemShape& s) {
  return score_rows(s, {"Wk", s.rel_w_size});
}
Shape sinks_shape(const ProblemShape& s) {
  return {{"H", s.heads}};
}
Shape extra_k_shape(const ProblemShape& s) {
  return {{"B", s.batch}, {"R", s.num_extra}, {"Hkv", s.kv_heads}, {"D", s.head_dim}};
}
Shape extra_v_shape(const ProblemShape& s) {
  return {{"B", s.batch}, {"R", s.num_extra}, {"Hkv", s.kv_heads}, {"Dv", s.value_dim}};
}

Status expect_head_dim(std::int64_t dim, const char* what, const char* symbol, const char* tensor) {
  if (dim >= 1 && dim <= kMaxHeadDim) return Status::ok_status();
  return invalid(what, " ", symbol, " = ", dim, " (the last dimension of ", tensor,
                 ") is not supported; expected 1..", kMaxHeadDim);
}

Status expect_window_bound(std::int64_t value, const char* name) {
  if (value >= -1) return Status::ok_status();
  return invalid("options.", name, " = ", value, "; expected -1 (unbounded) or a value >= 0");
}

// Neighborhood attention owns its masks: per-axis causality and the kernel are its window.
Status expect_no_sequence_masks(const AttentionOptions& o) {
  if (o.causal) {
    return invalid(
        "options.causal = true is not accepted by neighborhood attention; set "
        "NeighborhoodOptions.causal per axis instead");
  }
  if (o.window_left != -1 || o.window_right != -1) {
    return invalid("options.window_left = ", o.window_left,
                   " and options.window_right = ", o.window_right,
                   " are not accepted by neighborhood attention (its window is "
                   "NeighborhoodOptions.kernel_size); expected both -1");
  }
  return Status::ok_status();
}

Status check_scalars(const AttentionOptions& o, ProblemShape* s) {
  if (o.causal_alignment != CausalAlignment::kTopLeft &&
      o.causal_alignment != CausalAlignment::kBottomRight) {
    return invalid("options.causal_alignment = ", static_cast<int>(o.causal_alignment),
                   " is not a CausalAlignment; expected kTopLeft or kBottomRight");
  }
  if (o.cpu_backend != CpuBackend::kAuto && o.cpu_backend != CpuBackend::kReference) {
    return invalid("options.cpu_backend = ", static_cast<int>(o.cpu_backend),
                   " is not a CpuBackend; expected kAuto or kReference");
  }
  if (o.cpu_threads < 0) {
    return invalid("options.cpu_threads = ", o.cpu_threads,
                   "; expected a thread count >= 1, or 0 for the default");
  }
  if (s->layout == Layout::kNeighborhood) FMHA_RETURN_IF_ERROR(expect_no_sequence_masks(o));
  FMHA_RETURN_IF_ERROR(expect_window_bound(o.window_left, "window_left"));
  FMHA_RETURN_IF_ERROR(expect_window_bound(o.window_right, "window_right"));
  if (!std::isfinite(o.softcap) || o.softcap < 0.0f) {
    return invalid("options.softcap = ", o.softcap,
                   "; expected a finite value >= 0 (0 disables it)");
  }
  if (o.scale && !std::isfinite(*o.scale)) {
    return invalid("options.scale = ", *o.scale,
                   "; expected a finite value (or none for 1/sqrt(D))");
  }
  s->scale = o.scale ? *o.scale : 1.0f / std::sqrt(static_cast<float>(s->head_dim));
  return Status::ok_status();
}

// Both halves of a pair (rel_h/rel_w, extra_k/extra_v) or neither.
Status expect_pair(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name,
                   const char* what) {
  if (a.defined() == b.defined()) return Status::ok_status();
  const char* given = a.defined() ? a_name : b_name;
  const char* missing = a.defined() ? b_name : a_name;
  return invalid(given, " is given but ", missing, " is not; ", what, " needs both");
}

Status check_rel_pos(const Anchor& a, const AttentionOptions& o, ProblemShape* s) {
  FMHA_RETURN_IF_ERROR(expect_pair(o.rel_h, "options.rel_h", o.rel_w, "options.rel_w",
                                   "the decomposed relative-position bias"));
  if (!o.rel_h.defined()) return Status::ok_status();
  if (s->layout == Layout::kVarlen) {
    return invalid(
        "options.rel_h / options.rel_w are not accepted for variable-length batches "
        "(a packed batch has no common key grid); use options.bias");
  }
  FMHA_RETURN_IF_ERROR(expect_rank(o.rel_h, "options.rel_h", 4, "[B, H, Lq, Hk]"));
  FMHA_RETURN_IF_ERROR(expect_rank(o.rel_w, "options.rel_w", 4, "[B, H, Lq, Wk]"));
  s->rel_h_size = o.rel_h.size(3);
  s->rel_w_size = o.rel_w.size(3);
  std::int64_t grid_keys = 0;
  if (!checked_mul(s->rel_h_size, s->rel_w_size, &grid_keys) || grid_keys != s->seqlen_k) {
    return invalid("rel_pos shape does not match the key grid: options.rel_h has Hk = ",
                   s->rel_h_size, " and options.rel_w has Wk = ", s->rel_w_size,
                   " but there are Lk = ", s->seqlen_k, " keys; expected Hk * Wk = Lk");
  }
  FMHA_RETURN_IF_ERROR(
      expect_data_tensor(a, o.rel_h, "options.rel_h", rel_h_shape(*s), Access::kBroadcastInput));
  return expect_data_tensor(a, o.rel_w, "options.rel_w", rel_w_shape(*s), Access::kBroadcastInput);
}

Status check_extra_keys(const Anchor& a, const AttentionOptions& o, ProblemShape* s) {
  FMHA_RETURN_IF_ERROR(
      expect_pair(o.extra_k, "options.extra_k", o.extra_v, "options.extra_v", "extra keys"));
  if (!o.extra_k.defined()) return Status::ok_status();
  FMHA_RETURN_IF_ERROR(expect_rank(o.extra_k, "options.extra_k", 4, "[B, R, Hkv, D]"));
  s->num_extra = o.extra_k.size(1);
  FMHA_RETURN_IF_ERROR(
      expect_data_tensor(a, o.extra_k, "options.extra_k", extra_k_shape(*s), Access::kInput));
  return expect_data_tensor(a, o.extra_v, "options.extra_v", extra_v_shape(*s), Access::kInput);
}

// A gradient other than dq/dk/dv is optional, and only meaningful when its input is given.
Status expect_input_of(const TensorView& grad, const char* grad_name, const TensorView& input,
                       const char* input_name) {
  if (!grad.defined() || input.defined()) return Status::ok_status();
  return invalid(grad_name, " is given but ", input_name,
                 " is not; a gradient may be given only together with its input");
}

}  // namespace

Shape q_shape(const ProblemShape& s) {
  return with(token_dims(s, false), {{"H", s.heads}, {"D", s.head_dim}});
}
Shape k_shape(const ProblemShape& s) {
  return with(token_dims(s, true), {{"Hkv", s.kv_heads}, {"D", s.head_dim}});
}
Shape v_shape(const ProblemShape& s) {
  return with(token_dims(s, true), {{"Hkv", s.kv_heads}, {"Dv", s.value_dim}});
}
Shape out_shape(const ProblemShape& s) {
  return with(token_dims(s, false), {{"H", s.heads}, {"Dv", s.value_dim}});
}
Shape lse_shape(const ProblemShape& s) {
  if (s.layout == Layout::kVarlen) return {{"H", s.heads}, {"total_q", s.total_q}};
  Shape dims = token_dims(s, false);
  dims.insert(dims.begin() + 1, {"H", s.heads});
  return dims;
}

Status check_head_sizes(const ProblemShape& s) {
  if (s.heads < 1) return invalid("q has ", s.heads, " heads; expected at least 1");
  if (s.kv_heads < 1) return invalid("k has ", s.kv_heads, " heads; expected at least 1");
  if (s.heads % s.kv_heads != 0) {
    return invalid("k has ", s.kv_heads, " heads but q has ", s.heads,
                   "; q heads must be a multiple of k heads");
  }
  FMHA_RETURN_IF_ERROR(expect_head_dim(s.head_dim, "head dim", "D", "q"));
  return expect_head_dim(s.value_dim, "value head dim", "Dv", "v");
}

Status check_qkv(const Anchor& a, const TensorView& q, const TensorView& k, const TensorView& v,
                 const ProblemShape& s) {
  FMHA_RETURN_IF_ERROR(expect_data_tensor(a, q, "q", q_shape(s), Access::kInput));
  FMHA_RETURN_IF_ERROR(expect_data_tensor(a, k, "k", k_shape(s), Access::kInput));
  return expect_data_tensor(a, v, "v", v_shape(s), Access::kInput);
}

Status check_option_ranks(const AttentionOptions& o) {
  return expect_valid_ranks({{&o.bias, "options.bias"},
                             {&o.rel_h, "options.rel_h"},
                             {&o.rel_w, "options.rel_w"},
                             {&o.sinks, "options.sinks"},
                             {&o.extra_k, "options.extra_k"},
                             {&o.extra_v, "options.extra_v"}});
}

Status check_options(const Anchor& a, const AttentionOptions& o, ProblemShape* s) {
  FMHA_RETURN_IF_ERROR(check_scalars(o, s));
  if (o.bias.defined()) {
    FMHA_RETURN_IF_ERROR(
        expect_data_tensor(a, o.bias, "options.bias", bias_shape(*s), Access::kBroadcastInput));
  }
  FMHA_RETURN_IF_ERROR(check_rel_pos(a, o, s));
  if (o.sinks.defined()) {
    FMHA_RETURN_IF_ERROR(
        expect_stat_tensor(a, o.sinks, "options.sinks", sinks_shape(*s), Access::kInput));
  }
  return check_extra_keys(a, o, s);
}

Status check_forward_outputs(const Anchor& a, const TensorView& out, const TensorView& lse,
                             const ProblemShape& s) {
  FMHA_RETURN_IF_ERROR(expect_data_tensor(a, out, "out", out_shape(s), Access::kOutput));
  if (!lse.defined()) return Status::ok_status();
  return expect_stat_tensor(a, lse, "lse", lse_shape(s), Access::kOutput);
}

Status check_backward_inputs(const Anchor& a, const TensorView& out, const TensorView& lse,
                             const TensorView& dout, const TensorView& dlse,
                             const ProblemShape& s) {
  FMHA_RETURN_IF_ERROR(expect_given(out, "out", "the backward pass needs the forward's output"));
  FMHA_RETURN_IF_ERROR(
      expect_given(lse, "lse", "the backward pass needs the forward's log-sum-exp"));
  FMHA_RETURN_IF_ERROR(expect_given(dout, "dout", "the backward pass needs the output gradient"));
  FMHA_RETURN_IF_ERROR(expect_data_tensor(a, out, "out", out_shape(s), Access::kInput));
  FMHA_RETURN_IF_ERROR(expect_stat_tensor(a, lse, "lse", lse_shape(s), Access::kInput));
  FMHA_RETURN_IF_ERROR(expect_data_tensor(a, dout, "dout", out_shape(s), Access::kInput));
  if (!dlse.defined()) return Status::ok_status();
  return expect_stat_tensor(a, dlse, "dlse", lse_shape(s), Access::kInput);
}

Status check_gradients(const Anchor& a, const AttentionGradients& g, const AttentionOptions& o,
                       const ProblemShape& s) {
  FMHA_RETURN_IF_ERROR(expect_data_tensor(a, g.dq, "grads.dq", q_shape(s), Access::kOutput));
  FMHA_RETURN_IF_ERROR(expect_data_tensor(a, g.dk, "grads.dk", k_shape(s), Access::kOutput));
  FMHA_RETURN_IF_ERROR(expect_data_tensor(a, g.dv, "grads.dv", v_shape(s), Access::kOutput));

  FMHA_RETURN_IF_ERROR(expect_input_of(g.dbias, "grads.dbias", o.bias, "options.bias"));
  FMHA_RETURN_IF_ERROR(expect_input_of(g.drel_h, "grads.drel_h", o.rel_h, "options.rel_h"));
  FMHA_RETURN_IF_ERROR(expect_input_of(g.drel_w, "grads.drel_w", o.rel_w, "options.rel_w"));
  FMHA_RETURN_IF_ERROR(expect_input_of(g.dsinks, "grads.dsinks", o.sinks, "options.sinks"));
  FMHA_RETURN_IF_ERROR(expect_input_of(g.dextra_k, "grads.dextra_k", o.extra_k, "options.extra_k"));
  FMHA_RETURN_IF_ERROR(expect_input_of(g.dextra_v, "grads.dextra_v", o.extra_v, "options.extra_v"));

  if (g.dbias.defined()) {
    FMHA_RETURN_IF_ERROR(expect_broadcast_gradient(
        a, g.dbias, "grads.dbias", o.bias, "options.bias", shape_of(o.bias, bias_shape(s))));
  }
  // rel-pos gradients have their input's shape (a size-1 dimension receives the sum over it) but
  // are plain outputs: for a stride-0 rel_h the caller passes a dense drel_h and reduces it
  // itself, as the Python layer does. Only dbias must mirror its input's strides (SPEC §4).
  if (g.drel_h.defined()) {
    FMHA_RETURN_IF_ERROR(expect_data_tensor(a, g.drel_h, "grads.drel_h",
                                            shape_of(o.rel_h, rel_h_shape(s)), Access::kOutput));
  }
  if (g.drel_w.defined()) {
    FMHA_RETURN_IF_ERROR(expect_data_tensor(a, g.drel_w, "grads.drel_w",
                                            shape_of(o.rel_w, rel_w_shape(s)), Access::kOutput));
  }
  if (g.dsinks.defined()) {
    FMHA_RETURN_IF_ERROR(
        expect_stat_tensor(a, g.dsinks, "grads.dsinks", sinks_shape(s), Access::kOutput));
  }
  if (g.dextra_k.defined()) {
    FMHA_RETURN_IF_ERROR(
        expect_data_tensor(a, g.dextra_k, "grads.dextra_k", extra_k_shape(s), Access::kOutput));
  }
  if (g.dextra_v.defined()) {
    FMHA_RETURN_IF_ERROR(
        expect_data_tensor(a, g.dextra_v, "grads.dextra_v", extra_v_shape(s), Access::kOutput));
  }
  return Status::ok_status();
}

Status check_backward_impl(BackwardImpl impl) {
  if (impl == BackwardImpl::kAuto || impl == BackwardImpl::kFused || impl == BackwardImpl::kSplit) {
    return Status::ok_status();
  }
  return invalid("backward_impl = ", static_cast<int>(impl),
                 " is not a BackwardImpl; expected kAuto, kFused or kSplit");
}

}  // namespace fmha::detail
