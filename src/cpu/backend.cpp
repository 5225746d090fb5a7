// Adapters from the dense and varlen parameters to the kernels' Call, the coverage rule, and the
// choice of instruction set.
#include "cpu/backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "cpu/kernels.h"
#include "cpu/neighborhood.h"
#include "cpu/parallel.h"

namespace fmha::cpu {
namespace {

// A view whose dimensions batch, token, head and feature (-1: absent) are those of an Operand.
Operand operand(const TensorView& t, int batch, int token, int head, int feature) {
  if (!t.defined()) return {};
  const auto stride = [&](int d) { return d < 0 ? 0 : t.stride[static_cast<std::size_t>(d)]; };
  return {.data = t.data,
          .dtype = t.dtype,
          .batch_stride = stride(batch),
          .token_stride = stride(token),
          .head_stride = stride(head),
          .feature_stride = stride(feature)};
}
// Dense q [B, L, H, D] and lse [B, H, L]; packed q [total, H, D] and lse [H, total].
Operand dense_rows(const TensorView& t) { return operand(t, 0, 1, 2, 3); }
Operand dense_stats(const TensorView& t) { return operand(t, 0, 2, 1, -1); }
Operand packed_rows(const TensorView& t) { return operand(t, -1, 0, 1, 2); }
Operand packed_stats(const TensorView& t) { return operand(t, -1, 1, 0, -1); }
// sinks / dsinks [H].
Operand per_head(const TensorView& t) { return operand(t, -1, -1, 0, -1); }

// The stride between consecutive tokens of grid axes first .. first + rank - 1 of t, flattened
// row-major, when one stride serves them all (each axis's stride its inner axes' token count times
// the innermost's; axes of size 1 aside, as the layouts of a contiguous tensor and its reshapes
// give): false otherwise. An undefined tensor has one (0).
bool flat_grid_stride(const TensorView& t, int first, int rank, std::int64_t* stride) {
  *stride = 0;
  if (!t.defined()) return true;
  std::int64_t tokens = 1;  // tokens of the axes inside the current one
  bool found = false;
  for (int r = rank - 1; r >= 0; --r) {
    const auto u = static_cast<std::size_t>(first + r);
    if (t.shape[u] == 1) continue;
    if (!found) {
      *stride = t.stride[u];
      found = true;
    } else if (t.stride[u] != *stride * tokens) {
      return false;
    }
    tokens *= t.shape[u];
  }
  return true;
}
// Neighborhood q [B, X..., H, D] and lse [B, H, X...] as operands of flattened grids: a token
// stride, which flat_grid_stride must have found (supports()).
Operand grid_rows(const TensorView& t, int rank) {
  Operand op = operand(t, 0, -1, rank + 1, rank + 2);
  flat_grid_stride(t, 1, rank, &op.token_stride);
  return op;
}
Operand grid_stats(const TensorView& t, int rank) {
  Operand op = operand(t, 0, -1, 1, -1);
  flat_grid_stride(t, 2, rank, &op.token_stride);
  return op;
}

Call shared_call(const AttentionOptions& o, const detail::ProblemShape& shape) {
  Call c;
  c.heads = shape.heads;
  c.kv_heads = shape.kv_heads;
  c.head_dim = shape.head_dim;
  c.value_dim = shape.value_dim;
  c.total_q = shape.total_q;
  c.scale = shape.scale;
  c.softcap = o.softcap;
  c.options = &o;
  c.threads = thread_count(o.cpu_threads);
  c.sinks = per_head(o.sinks);
  // [B, R, Hkv, *]: the layout of dense rows, varlen calls' batch index the sequence's.
  c.extra_k = dense_rows(o.extra_k);
  c.extra_v = dense_rows(o.extra_v);
  c.num_extra = o.extra_k.defined() ? shape.num_extra : 0;
  return c;
}

// The backward's dsinks, dextra_k and dextra_v (each optional).
void set_sink_and_extra_gradients(Call* c, const AttentionGradients& g) {
  c->dsinks = per_head(g.dsinks);
  c->dextra_k = dense_rows(g.dextra_k);
  c->dextra_v = dense_rows(g.dextra_v);
}

Call dense_call(const AttentionOptions& o, const detail::ProblemShape& shape) {
  Call c = shared_call(o, shape);
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    c.sequences.push_back({.batch = b,
                           .index = b,
                           .len_q = shape.seqlen_q,
                           .len_k = shape.seqlen_k,
                           .row = b * shape.seqlen_q});
  }
  return c;
}

template <typename Params>
Call varlen_call(const Params& p, const detail::ProblemShape& shape) {
  Call c = shared_call(p.options, shape);
  // cu_seqlens lives in host memory for the CPU backend (validated: ascending, ending at the rows).
  const auto offset = [](const TensorView& cu, std::int64_t b) -> std::int64_t {
    return static_cast<const std::int32_t*>(cu.data)[b * cu.stride[0]];
  };
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    const std::int64_t first_q = offset(p.cu_seqlens_q, b), first_k = offset(p.cu_seqlens_k, b);
    c.sequences.push_back({.batch = 0,
                           .index = b,
                           .first_q = first_q,
                           .len_q = offset(p.cu_seqlens_q, b + 1) - first_q,
                           .first_k = first_k,
                           .len_k = offset(p.cu_seqlens_k, b + 1) - first_k,
                           .row = first_q});
  }
  return c;
}

// Handing tasks to a kept worker costs time a tiny problem does not repay. On a 2-core AMD EPYC
// (2026-11-27, causal fp32 forward, H 2, D 32, a call from Python, sleeping workers): 2 MFLOP
// (B 1, L 128) 102 us on 2 threads, 71 on one; 8 MFLOP 130 / 110; 17 MFLOP 160 / 178; 67 MFLOP
// 297 / 450. Since workers spin a while between calls (thread_pool.cpp), 2026-11-28 from C++ with
// 30 us between calls: B 2 H 2 L 128 D 32 forward (8.4 MFLOP) 47-50 us on 2 threads, 75-78 on one.
// A call takes one thread per flops_per_thread of its products (every pair counted, masks or not),
// at least one; the results do not depend on the thread count (parallel.h).
struct Work {
  double products;  // products a pair costs: 2 FLOPs per multiply-add
  double flops_per_thread;
};
// The forward: two products, one thread per 3 MFLOP. The backward: five, one thread per 6 MFLOP,
// which also keeps small problems on its fused structure (backward.cpp's use_fused looks at the
// threads the size warrants): B1 H2 L128 D32 forward + backward on one thread 124 us fused, 159
// split; on two threads the split gained nothing at that size.
constexpr Work kForward{2.0, 3e6}, kBackward{5.0, 6e6};
void fit_threads_to_work(Call* c, const Work& work) {
  double pairs = 0.0;
  for (const Sequence& s : c->sequences) {
    const std::int64_t keys = c->neighborhood != nullptr
                                  ? std::min(c->neighborhood->keys_per_query, s.len_k)
                                  : s.len_k;
    pairs += static_cast<double>(s.len_q) * static_cast<double>(keys + c->num_extra);
  }
  const double flops = work.products * pairs * static_cast<double>(c->heads) *
                       static_cast<double>(c->head_dim + c->value_dim);
  const double useful = std::min(std::max(1.0, flops / work.flops_per_thread), 1024.0);
  c->work_threads = static_cast<int>(useful);
  if (useful < c->threads) c->threads = c->work_threads;
}

bool isa_allowed(const char* name) {
  const char* env = std::getenv("FMHA_CPU_ISA");
  if (env == nullptr || *env == '\0') return true;
  // Each name allows itself and every ISA below it.
  const char* order[] = {"portable", "avx2", "avx512", "avx512bf16"};
  int requested = -1, asked = -1;
  for (int i = 0; i < 4; ++i) {
    if (std::strcmp(env, order[i]) == 0) requested = i;
    if (std::strcmp(name, order[i]) == 0) asked = i;
  }
  return requested < 0 || asked <= requested;
}

#if FMHA_CPU_X86
// Whether FMHA_CPU_ISA names this ISA itself.
bool isa_requested(const char* name) {
  const char* env = std::getenv("FMHA_CPU_ISA");
  return env != nullptr && std::strcmp(env, name) == 0;
}

// Whether the bf16 dot product beats two fp32 FMAs here, so that avx512bf16 is the default: on
// AMD's cores (Zen 5, 2026-11-28: bf16 forward 2.12-3.06x PyTorch's CPU SDPA against 1.72-2.51x on
// fp32 FMAs, one thread), not on Intel's, where the product ran at about the fp32 FMAs' rate (107
// GFLOP/s a core, as if vdpbf16ps issued once a cycle), so that it saves nothing and the bf16
// path's own work (operands packed as pairs, S scaled in a pass of its own) makes it the slower
// one: one thread of a 2-core Intel Xeon (AVX-512 BF16 / FP16, 2026-11-29), bf16 B 1 H 8, avx512
// against avx512bf16, ms: D 128 L 1024 forward 39.0 / 52.6, backward 89.1 / 117.5; D 64 L 1024
// forward 31.5 / 38.1, backward 52.2 / 89.4; D 128 causal L 2048 forward 104.8 / 159.2; D 128 L 512
// forward 14.4 / 13.7. FMHA_CPU_ISA=avx512bf16 selects it anywhere the CPU has it (the tests do).
bool bf16_dot_pays() {
  return __builtin_cpu_is("amd") || isa_requested("avx512bf16");
}
#endif

}  // namespace

Isa selected_isa() {
#if FMHA_CPU_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("fma") && isa_allowed("avx512")) {
    return __builtin_cpu_supports("avx512bf16") && isa_allowed("avx512bf16") && bf16_dot_pays()
               ? Isa::kAvx512Bf16
               : Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && isa_allowed("avx2")) {
    return Isa::kAvx2;
  }
#endif
  return Isa::kPortable;
}

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Bf16:
      return "avx512bf16";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kPortable:
      return "portable";
  }
  return "unknown";
}

bool supports(const AttentionOptions& /*options: every option is taken*/, DType dtype) {
  const bool dtype_ok =
      dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  return dtype_ok;
}

// A gradient (dbias, drel_h, drel_w) at full size with no dimension from `first` on broadcast by
// stride 0: each of its rows there belongs to one (b, h, i), so the task that owns query row i
// writes it (a sum over a broadcast dimension needs an order of its own to stay independent of the
// thread count).
bool full_size(const TensorView& grad, const std::int64_t (&sizes)[4], int first = 0) {
  for (int d = first; d < 4; ++d) {
    const auto u = static_cast<std::size_t>(d);
    if (grad.shape[u] != sizes[d] || (grad.stride[u] == 0 && sizes[d] > 1)) return false;
  }
  return true;
}

// The dimensions of [B, H, Lq, Lk] that dbias sums over: broadcast there, by a size of 1 or a
// stride of 0, over more than one batch / head / row / key. True when it sums over one at least and
// is full elsewhere; the dQ pass sums them in a fixed order (backward.cpp).
bool summed_dims(const TensorView& dbias, const detail::ProblemShape& shape, bool (&sums)[4]) {
  const std::int64_t sizes[4] = {shape.batch, shape.heads, shape.seqlen_q, shape.seqlen_k};
  std::int64_t full[4];
  TensorView rest = dbias;  // the dimensions it does not sum over must be full
  bool any = false;
  for (int d = 0; d < 4; ++d) {
    const auto u = static_cast<std::size_t>(d);
    sums[d] = sizes[d] > 1 && (dbias.shape[u] == 1 || dbias.stride[u] == 0);
    any = any || sums[d];
    full[d] = sums[d] ? dbias.shape[u] : sizes[d];
    if (sums[d]) rest.stride[u] = 1;
  }
  return any && full_size(rest, full);
}

// A neighborhood call without bias or rel-pos (their gathered keys are not consecutive), every
// tensor's grid flattened by one token stride, and axes whose group-major coordinates (below twice
// the axis) fit the int32 the mask compares.
template <typename Params>
bool supports_neighborhood(const Params& p, const detail::ProblemShape& shape,
                           std::initializer_list<const TensorView*> rows,
                           std::initializer_list<const TensorView*> stats) {
  constexpr std::int64_t kMaxAxis = std::int64_t{1} << 30;
  for (int r = 0; r < shape.grid_rank; ++r) {
    if (shape.grid[static_cast<std::size_t>(r)] >= kMaxAxis) return false;
  }
  std::int64_t stride = 0;
  for (const TensorView* t : rows) {
    if (!flat_grid_stride(*t, 1, shape.grid_rank, &stride)) return false;
  }
  for (const TensorView* t : stats) {
    if (!flat_grid_stride(*t, 2, shape.grid_rank, &stride)) return false;
  }
  return supports(p.options, p.q.dtype) && !p.options.bias.defined() &&
         !p.options.rel_h.defined();
}

bool supports(const NeighborhoodForwardParams& p, const detail::ProblemShape& shape) {
  return supports_neighborhood(p, shape, {&p.q, &p.k, &p.v, &p.out}, {&p.lse});
}
bool supports(const NeighborhoodBackwardParams& p, const detail::ProblemShape& shape) {
  const AttentionGradients& g = p.grads;
  return supports_neighborhood(p, shape, {&p.q, &p.k, &p.v, &p.out, &p.dout, &g.dq, &g.dk, &g.dv},
                               {&p.lse, &p.dlse});
}

bool supports(const AttentionForwardParams& p, const detail::ProblemShape&) {
  return supports(p.options, p.q.dtype);
}
bool supports(const VarlenForwardParams& p, const detail::ProblemShape&) {
  return supports(p.options, p.q.dtype);
}
bool supports(const VarlenBackwardParams& p, const detail::ProblemShape&) {
  return supports(p.options, p.q.dtype) && !p.grads.dbias.defined();
}
bool supports(const AttentionBackwardParams& p, const detail::ProblemShape& shape) {
  const AttentionGradients& g = p.grads;
  const std::int64_t problem[4] = {shape.batch, shape.heads, shape.seqlen_q, shape.seqlen_k};
  const std::int64_t rel_h[4] = {shape.batch, shape.heads, shape.seqlen_q, shape.rel_h_size};
  const std::int64_t rel_w[4] = {shape.batch, shape.heads, shape.seqlen_q, shape.rel_w_size};
  bool sums[4];
  return supports(p.options, p.q.dtype) &&
         (!g.dbias.defined() || full_size(g.dbias, problem) ||
          summed_dims(g.dbias, shape, sums)) &&
         (!g.drel_h.defined() || full_size(g.drel_h, rel_h)) &&
         (!g.drel_w.defined() || full_size(g.drel_w, rel_w));
}

// A bias or rel-pos view as a score term (4-D, any strides; a dimension of size 1 broadcasts
// whatever its stride).
ScoreTerm score_term(const TensorView& t) {
  ScoreTerm term;
  if (!t.defined()) return term;
  term.data = t.data;
  term.dtype = t.dtype;
  for (int d = 0; d < 4; ++d) {
    const auto u = static_cast<std::size_t>(d);
    term.stride[d] = t.shape[u] == 1 ? 0 : t.stride[u];
  }
  return term;
}

// The dense calls' bias and rel-pos.
void set_score_terms(Call* c, const AttentionOptions& o, const detail::ProblemShape& shape) {
  c->bias = score_term(o.bias);
  c->rel_h = score_term(o.rel_h);
  c->rel_w = score_term(o.rel_w);
  c->rel_w_size = shape.rel_w_size;
}

void run(const AttentionForwardParams& p, const detail::ProblemShape& shape) {
  Call c = dense_call(p.options, shape);
  set_score_terms(&c, p.options, shape);
  c.q = dense_rows(p.q);
  c.k = dense_rows(p.k);
  c.v = dense_rows(p.v);
  c.out = dense_rows(p.out);
  c.lse = dense_stats(p.lse);
  fit_threads_to_work(&c, kForward);
  forward(c);
}

void run(const AttentionBackwardParams& p, const detail::ProblemShape& shape) {
  Call c = dense_call(p.options, shape);
  set_score_terms(&c, p.options, shape);
  c.q = dense_rows(p.q);
  c.k = dense_rows(p.k);
  c.v = dense_rows(p.v);
  c.out = dense_rows(p.out);
  c.lse = dense_stats(p.lse);
  c.dout = dense_rows(p.dout);
  c.dlse = dense_stats(p.dlse);
  c.dq = dense_rows(p.grads.dq);
  c.dk = dense_rows(p.grads.dk);
  c.dv = dense_rows(p.grads.dv);
  set_sink_and_extra_gradients(&c, p.grads);
  c.backward_impl = p.backward_impl;
  if (p.grads.dbias.defined()) {
    c.dbias = score_term(p.grads.dbias);
    if (!summed_dims(p.grads.dbias, shape, c.dbias_sums)) {
      for (bool& sum : c.dbias_sums) sum = false;
    }
  }
  c.drel_h = score_term(p.grads.drel_h);
  c.drel_w = score_term(p.grads.drel_w);
  c.rel_h_size = shape.rel_h_size;
  fit_threads_to_work(&c, kBackward);
  backward(c);
}

void run(const VarlenForwardParams& p, const detail::ProblemShape& shape) {
  Call c = varlen_call(p, shape);
  set_score_terms(&c, p.options, shape);
  c.q = packed_rows(p.q);
  c.k = packed_rows(p.k);
  c.v = packed_rows(p.v);
  c.out = packed_rows(p.out);
  c.lse = packed_stats(p.lse);
  fit_threads_to_work(&c, kForward);
  forward(c);
}

void run(const VarlenBackwardParams& p, const detail::ProblemShape& shape) {
  Call c = varlen_call(p, shape);
  set_score_terms(&c, p.options, shape);
  c.q = packed_rows(p.q);
  c.k = packed_rows(p.k);
  c.v = packed_rows(p.v);
  c.out = packed_rows(p.out);
  c.lse = packed_stats(p.lse);
  c.dout = packed_rows(p.dout);
  c.dlse = packed_stats(p.dlse);
  c.dq = packed_rows(p.grads.dq);
  c.dk = packed_rows(p.grads.dk);
  c.dv = packed_rows(p.grads.dv);
  set_sink_and_extra_gradients(&c, p.grads);
  c.backward_impl = p.backward_impl;
  fit_threads_to_work(&c, kBackward);
  backward(c);
}

// A neighborhood call over `geometry` with the operands its forward and backward share.
template <typename Params>
Call neighborhood_call(const Params& p, const detail::ProblemShape& shape,
                       const NeighborhoodGeometry& geometry) {
  Call c = dense_call(p.options, shape);
  c.neighborhood = &geometry;
  const int rank = shape.grid_rank;
  c.q = grid_rows(p.q, rank);
  c.k = grid_rows(p.k, rank);
  c.v = grid_rows(p.v, rank);
  c.out = grid_rows(p.out, rank);
  c.lse = grid_stats(p.lse, rank);
  return c;
}

void run(const NeighborhoodForwardParams& p, const detail::ProblemShape& shape) {
  const NeighborhoodGeometry geometry =
      NeighborhoodGeometry::of(p.neighborhood, shape.grid_rank, shape.grid);
  Call c = neighborhood_call(p, shape, geometry);
  fit_threads_to_work(&c, kForward);
  forward(c);
}

void run(const NeighborhoodBackwardParams& p, const detail::ProblemShape& shape) {
  const NeighborhoodGeometry geometry =
      NeighborhoodGeometry::of(p.neighborhood, shape.grid_rank, shape.grid);
  Call c = neighborhood_call(p, shape, geometry);
  const int rank = shape.grid_rank;
  c.dout = grid_rows(p.dout, rank);
  c.dlse = grid_stats(p.dlse, rank);
  c.dq = grid_rows(p.grads.dq, rank);
  c.dk = grid_rows(p.grads.dk, rank);
  c.dv = grid_rows(p.grads.dv, rank);
  set_sink_and_extra_gradients(&c, p.grads);
  c.backward_impl = p.backward_impl;
  fit_threads_to_work(&c, kBackward);
  backward(c);
}

}  // namespace fmha::cpu
