// The attention entry points: one layout-specific step that reads the sizes of q, k and v into a
// ProblemShape (dense, varlen, neighborhood), then the checks every layout shares
// (validate_attention.h), written once for forward and once for backward.
#include "api/validate.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "api/validate_attention.h"
#include "api/validate_message.h"
#include "api/validate_tensor.h"

namespace fmha::detail {
namespace {

Anchor anchor_of(const TensorView& q) {
  return {"q", q.dtype, q.device};
}

// The sizes every layout reads the same way: q [..., H, D], k [..., Hkv, D], v [..., Hkv, Dv].
void read_head_sizes(const TensorView& q, const TensorView& k, const TensorView& v,
                     ProblemShape* s) {
  s->heads = q.size(-2);
  s->head_dim = q.size(-1);
  s->kv_heads = k.size(-2);
  s->value_dim = v.size(-1);
}

// ---- Dense: q [B, Lq, H, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv] ----------------------------

template <typename Params>
Status resolve_dense(const Params& p, ProblemShape* s) {
  FMHA_RETURN_IF_ERROR(expect_anchor(p.q, "q", 4, "[B, Lq, H, D]"));
  FMHA_RETURN_IF_ERROR(expect_rank(p.k, "k", 4, "[B, Lk, Hkv, D]"));
  FMHA_RETURN_IF_ERROR(expect_rank(p.v, "v", 4, "[B, Lk, Hkv, Dv]"));
  s->layout = Layout::kDense;
  read_head_sizes(p.q, p.k, p.v, s);
  FMHA_RETURN_IF_ERROR(check_head_sizes(*s));
  s->batch = p.q.size(0);
  s->seqlen_q = p.q.size(1);
  s->seqlen_k = p.k.size(1);
  return Status::ok_status();
}

// ---- Varlen: q [total_q, H, D], cu_seqlens [B + 1] int32 ---------------------------------------

}  // namespace

// Offsets start at 0, never decrease, end at the row count, and no sequence is longer than
// max_seqlen. Only CPU offsets are read here: reading CUDA ones needs a device synchronisation,
// which the library does only when asked (check_cu_seqlens: the CUDA backend copies them to the
// host and calls this on the copy); otherwise its kernels clamp what they read.
Status check_offsets(const TensorView& cu, const char* name, std::int64_t rows, const char* rows_of,
                     std::int64_t max_seqlen, const char* max_name) {
  if (cu.device.type != DeviceType::kCPU) return Status::ok_status();
  const auto* offsets = static_cast<const std::int32_t*>(cu.data);
  const std::int64_t stride = cu.stride[0];
  auto at = [&](std::int64_t i) { return static_cast<std::int64_t>(offsets[i * stride]); };
  if (at(0) != 0) {
    return invalid(name, "[0] = ", at(0), "; expected 0 (the first sequence starts at row 0)");
  }
  const std::int64_t batch = cu.size(0) - 1;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t begin = at(b), end = at(b + 1);
    if (end < begin) {
      return invalid(name, "[", b + 1, "] = ", end, " is less than ", name, "[", b, "] = ", begin,
                     "; offsets must be non-decreasing");
    }
    if (end - begin > max_seqlen) {
      return invalid("sequence ", b, " has ", end - begin, " rows (", name, "[", b + 1, "] - ",
                     name, "[", b, "]) but ", max_name, " = ", max_seqlen,
                     "; expected every length <= ", max_name);
    }
  }
  if (at(batch) != rows) {
    return invalid(name, "[", batch, "] = ", at(batch), " but ", rows_of, " has ", rows,
                   " rows; the last offset must equal the row count");
  }
  return Status::ok_status();
}

namespace {

Status expect_max_seqlen(std::int64_t value, const char* name) {
  if (value >= 0) return Status::ok_status();
  return invalid(name, " = ", value, "; expected a value >= 0");
}

template <typename Params>
Status resolve_varlen(const Params& p, ProblemShape* s) {
  FMHA_RETURN_IF_ERROR(expect_anchor(p.q, "q", 3, "[total_q, H, D]"));
  FMHA_RETURN_IF_ERROR(expect_rank(p.k, "k", 3, "[total_k, Hkv, D]"));
  FMHA_RETURN_IF_ERROR(expect_rank(p.v, "v", 3, "[total_k, Hkv, Dv]"));
  FMHA_RETURN_IF_ERROR(expect_rank(p.cu_seqlens_q, "cu_seqlens_q", 1, "[B + 1]"));
  if (p.cu_seqlens_q.size(0) < 1) {
    return invalid("cu_seqlens_q has shape [0]; expected [B + 1] (at least the leading 0)");
  }
  FMHA_RETURN_IF_ERROR(expect_max_seqlen(p.max_seqlen_q, "max_seqlen_q"));
  FMHA_RETURN_IF_ERROR(expect_max_seqlen(p.max_seqlen_k, "max_seqlen_k"));
  s->layout = Layout::kVarlen;
  read_head_sizes(p.q, p.k, p.v, s);
  FMHA_RETURN_IF_ERROR(check_head_sizes(*s));
  s->batch = p.cu_seqlens_q.size(0) - 1;
  s->seqlen_q = p.max_seqlen_q;
  s->seqlen_k = p.max_seqlen_k;
  s->total_q = p.q.size(0);
  s->total_k = p.k.size(0);

  const Anchor a = anchor_of(p.q);
  const Shape offsets_shape{{"B + 1", s->batch + 1}};
  FMHA_RETURN_IF_ERROR(expect_index_tensor(a, p.cu_seqlens_q, "cu_seqlens_q", offsets_shape));
  FMHA_RETURN_IF_ERROR(expect_index_tensor(a, p.cu_seqlens_k, "cu_seqlens_k", offsets_shape));
  FMHA_RETURN_IF_ERROR(
      check_offsets(p.cu_seqlens_q, "cu_seqlens_q", s->total_q, "q", s->seqlen_q, "max_seqlen_q"));
  return check_offsets(p.cu_seqlens_k, "cu_seqlens_k", s->total_k, "k", s->seqlen_k,
                       "max_seqlen_k");
}

// ---- Neighborhood: q [B, X1, (X2, (X3)), H, D]
// ---------------------------------------------------

std::string grid_string(const TensorView& t, int grid_rank) {
  std::string text = "[";
  for (int r = 0; r < grid_rank; ++r) {
    text += (r ? ", " : "") + std::to_string(t.size(1 + r));
  }
  return text + "]";
}

Status check_grid_matches(const TensorView& t, const char* name, const TensorView& q,
                          int grid_rank) {
  for (int r = 0; r < grid_rank; ++r) {
    if (t.size(1 + r) == q.size(1 + r)) continue;
    return invalid(name, " has grid ", grid_string(t, grid_rank), " but q has ",
                   grid_string(q, grid_rank),
                   "; neighborhood attention needs q, k and v on the same grid");
  }
  return Status::ok_status();
}

// Per axis: kernel_size >= 1, dilation >= 1, kernel_size * dilation <= grid size (SPEC §6).
Status check_neighborhood(const NeighborhoodOptions& na, const ProblemShape& s) {
  for (int r = 0; r < s.grid_rank; ++r) {
    const auto i = static_cast<std::size_t>(r);
    const std::int64_t kernel = na.kernel_size[i], dilation = na.dilation[i], size = s.grid[i];
    if (kernel < 1) {
      return invalid("kernel_size[", r, "] = ", kernel, "; expected >= 1");
    }
    if (dilation < 1) {
      return invalid("dilation[", r, "] = ", dilation, "; expected >= 1");
    }
    std::int64_t extent = 0;
    if (!checked_mul(kernel, dilation, &extent)) {
      return invalid("kernel_size[", r, "] * dilation[", r, "] = ", kernel, " * ", dilation,
                     " overflows int64; expected kernel_size * dilation <= grid size ", size);
    }
    if (extent > size) {
      return invalid("kernel_size[", r, "] * dilation[", r, "] = ", extent,
                     " exceeds the grid size ", size, " on axis ", r,
                     "; expected kernel_size * dilation <= grid size");
    }
  }
  return Status::ok_status();
}

template <typename Params>
Status resolve_neighborhood(const Params& p, ProblemShape* s) {
  const int grid_rank = p.neighborhood.num_dims;
  if (grid_rank < 1 || grid_rank > 3) {
    return invalid("neighborhood.num_dims = ", grid_rank, "; expected 1, 2 or 3");
  }
  static constexpr const char* kLayouts[3][3] = {
      {"[B, X1, H, D]", "[B, X1, Hkv, D]", "[B, X1, Hkv, Dv]"},
      {"[B, X1, X2, H, D]", "[B, X1, X2, Hkv, D]", "[B, X1, X2, Hkv, Dv]"},
      {"[B, X1, X2, X3, H, D]", "[B, X1, X2, X3, Hkv, D]", "[B, X1, X2, X3, Hkv, Dv]"}};
  const auto* layouts = kLayouts[grid_rank - 1];
  FMHA_RETURN_IF_ERROR(expect_anchor(p.q, "q", grid_rank + 3, layouts[0]));
  FMHA_RETURN_IF_ERROR(expect_rank(p.k, "k", grid_rank + 3, layouts[1]));
  FMHA_RETURN_IF_ERROR(expect_rank(p.v, "v", grid_rank + 3, layouts[2]));
  FMHA_RETURN_IF_ERROR(check_grid_matches(p.k, "k", p.q, grid_rank));
  FMHA_RETURN_IF_ERROR(check_grid_matches(p.v, "v", p.q, grid_rank));
  s->layout = Layout::kNeighborhood;
  read_head_sizes(p.q, p.k, p.v, s);
  FMHA_RETURN_IF_ERROR(check_head_sizes(*s));
  s->batch = p.q.size(0);
  s->grid_rank = grid_rank;
  s->grid = {1, 1, 1};
  std::int64_t tokens = 1;
  for (int r = 0; r < grid_rank; ++r) {
    s->grid[static_cast<std::size_t>(r)] = p.q.size(1 + r);
    if (!checked_mul(tokens, p.q.size(1 + r), &tokens)) {  // possible only when B = 0
      return invalid("q has grid ", grid_string(p.q, grid_rank),
                     ", more than 2^63 tokens; the token count must fit in int64");
    }
  }
  s->seqlen_q = s->seqlen_k = tokens;
  return check_neighborhood(p.neighborhood, *s);
}

Status resolve(const AttentionForwardParams& p, ProblemShape* s) {
  return resolve_dense(p, s);
}
Status resolve(const AttentionBackwardParams& p, ProblemShape* s) {
  return resolve_dense(p, s);
}
Status resolve(const VarlenForwardParams& p, ProblemShape* s) {
  return resolve_varlen(p, s);
}
Status resolve(const VarlenBackwardParams& p, ProblemShape* s) {
  return resolve_varlen(p, s);
}
Status resolve(const NeighborhoodForwardParams& p, ProblemShape* s) {
  return resolve_neighborhood(p, s);
}
Status resolve(const NeighborhoodBackwardParams& p, ProblemShape* s) {
  return resolve_neighborhood(p, s);
}

// ---- The shared sequence, forward and backward -----------------------------------------------

// Dense and neighborhood batches hold batch * seqlen tokens (varlen reads the totals from q and
// k). Once check_qkv has matched q and k to the shape, with H, D >= 1, these products are bounded
// by their element counts, which fit in int64.
void count_tokens(ProblemShape* s) {
  if (s->layout == Layout::kVarlen) return;
  s->total_q = s->batch * s->seqlen_q;
  s->total_k = s->batch * s->seqlen_k;
}

// Every view of the call, given or not, before any is read (expect_valid_ranks).
template <typename Params>
Status check_view_ranks(const Params& p) {
  FMHA_RETURN_IF_ERROR(expect_valid_ranks(
      {{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.out, "out"}, {&p.lse, "lse"}}));
  if constexpr (requires { p.cu_seqlens_q; }) {
    FMHA_RETURN_IF_ERROR(
        expect_valid_ranks({{&p.cu_seqlens_q, "cu_seqlens_q"}, {&p.cu_seqlens_k, "cu_seqlens_k"}}));
  }
  const AttentionOptions& o = p.options;
  FMHA_RETURN_IF_ERROR(check_option_ranks(o));
  if constexpr (requires { p.grads; }) {
    const AttentionGradients& g = p.grads;
    return expect_valid_ranks({{&p.dout, "dout"},
                               {&p.dlse, "dlse"},
                               {&g.dq, "grads.dq"},
                               {&g.dk, "grads.dk"},
                               {&g.dv, "grads.dv"},
                               {&g.dbias, "grads.dbias"},
                               {&g.drel_h, "grads.drel_h"},
                               {&g.drel_w, "grads.drel_w"},
                               {&g.dsinks, "grads.dsinks"},
                               {&g.dextra_k, "grads.dextra_k"},
                               {&g.dextra_v, "grads.dextra_v"}});
  }
  return Status::ok_status();
}

// What forward and backward check alike: the layout, q/k/v, the options.
template <typename Params>
Status validate_inputs(const Params& p, const Anchor& a, ProblemShape* s) {
  FMHA_RETURN_IF_ERROR(check_view_ranks(p));
  FMHA_RETURN_IF_ERROR(resolve(p, s));
  FMHA_RETURN_IF_ERROR(check_qkv(a, p.q, p.k, p.v, *s));
  count_tokens(s);
  return check_options(a, p.options, s);
}

template <typename Params>
Status validate_forward(const Params& p, ProblemShape* shape) {
  ProblemShape s;
  const Anchor a = anchor_of(p.q);
  FMHA_RETURN_IF_ERROR(validate_inputs(p, a, &s));
  FMHA_RETURN_IF_ERROR(check_forward_outputs(a, p.out, p.lse, s));
  *shape = s;
  return Status::ok_status();
}

template <typename Params>
Status validate_backward(const Params& p, ProblemShape* shape) {
  ProblemShape s;
  const Anchor a = anchor_of(p.q);
  FMHA_RETURN_IF_ERROR(validate_inputs(p, a, &s));
  FMHA_RETURN_IF_ERROR(check_backward_inputs(a, p.out, p.lse, p.dout, p.dlse, s));
  FMHA_RETURN_IF_ERROR(check_gradients(a, p.grads, p.options, s));
  FMHA_RETURN_IF_ERROR(check_backward_impl(p.backward_impl));
  *shape = s;
  return Status::ok_status();
}

}  // namespace

Status validate(const AttentionForwardParams& p, ProblemShape* s) {
  return validate_forward(p, s);
}
Status validate(const AttentionBackwardParams& p, ProblemShape* s) {
  return validate_backward(p, s);
}
Status validate(const VarlenForwardParams& p, ProblemShape* s) {
  return validate_forward(p, s);
}
Status validate(const VarlenBackwardParams& p, ProblemShape* s) {
  return validate_backward(p, s);
}
Status validate(const NeighborhoodForwardParams& p, ProblemShape* s) {
  return validate_forward(p, s);
}
Status validate(const NeighborhoodBackwardParams& p, ProblemShape* s) {
  return validate_backward(p, s);
}

}  // namespace fmha::detail
