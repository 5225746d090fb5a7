#include "test_case.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>

#include "naive/naive_masks.h"

namespace fmha_test {
namespace {

using fmha::Status;

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

const char* storage_name(Storage s) {
  switch (s) {
    case Storage::kContiguous: return "contiguous";
    case Storage::kPadded: return "padded";
    case Storage::kHeadsOuter: return "heads-outer";
    case Storage::kBroadcastBatch: return "broadcast-batch";
    case Storage::kBroadcastHeads: return "broadcast-heads";
  }
  return "?";
}

// q-like tensors: [B, L, H, X] (dense), [B, X1.., H, X] (NA), [T, H, X] (varlen).
Layout storage_layout(Storage s, int rank, Kind kind) {
  Layout layout;
  const int head_dim = rank - 2;
  switch (s) {
    case Storage::kContiguous: break;
    case Storage::kPadded: layout.pad = 3; break;
    case Storage::kHeadsOuter:
      if (kind == Kind::kVarlen) {
        layout.order = {1, 0, 2};
      } else {
        layout.order = {0, head_dim};
        for (int d = 1; d < head_dim; ++d) layout.order.push_back(d);
        layout.order.push_back(rank - 1);
      }
      break;
    case Storage::kBroadcastBatch:
      layout.broadcast.assign(static_cast<std::size_t>(rank), false);
      layout.broadcast[0] = true;
      break;
    case Storage::kBroadcastHeads:
      layout.broadcast.assign(static_cast<std::size_t>(rank), false);
      layout.broadcast[static_cast<std::size_t>(head_dim)] = true;
      break;
  }
  return layout;
}

// Outputs and gradients cannot alias: they take the input's layout without its broadcasts.
Storage writable(Storage s) {
  return s == Storage::kBroadcastBatch || s == Storage::kBroadcastHeads ? Storage::kContiguous : s;
}

// lse, dlse, sinks, dsinks: fp32, or fp64 for fp64 problems unless the case asks for fp32.
DType stats_dtype(const AttentionCase& c) {
  return c.dtype == DType::kFloat64 && !c.fp32_stats ? DType::kFloat64 : DType::kFloat32;
}

// Shape of a q-like tensor with `heads` heads and last dim `width`.
std::vector<std::int64_t> token_shape(const AttentionCase& c, bool keys, std::int64_t heads,
                                      std::int64_t width) {
  std::vector<std::int64_t> shape;
  switch (c.kind) {
    case Kind::kDense: shape = {c.batch, keys ? c.seqlen_k : c.seqlen_q}; break;
    case Kind::kVarlen: {
      const auto& lens = keys ? c.seqlens_k : c.seqlens_q;
      std::int64_t total = 0;
      for (auto l : lens) total += l;
      shape = {total};
      break;
    }
    case Kind::kNeighborhood:
      shape = {c.batch};
      for (int r = 0; r < c.neighborhood.num_dims; ++r) shape.push_back(c.grid[r]);
      break;
  }
  shape.push_back(heads);
  shape.push_back(width);
  return shape;
}

std::vector<std::int64_t> lse_shape(const AttentionCase& c) {
  switch (c.kind) {
    case Kind::kDense: return {c.batch, c.heads, c.seqlen_q};
    case Kind::kVarlen: return {c.heads, token_shape(c, false, 1, 1)[0]};
    case Kind::kNeighborhood: {
      std::vector<std::int64_t> shape{c.batch, c.heads};
      for (int r = 0; r < c.neighborhood.num_dims; ++r) shape.push_back(c.grid[r]);
      return shape;
    }
  }
  return {};
}

// A tensor of logical shape `full` broadcast over the flagged dims, by stride 0 or by size 1.
HostTensor broadcastable(DType dtype, std::vector<std::int64_t> full, const bool* broadcast, std::size_t count,
                         bool zero_stride) {
  Layout layout;
  layout.broadcast.assign(full.size(), false);
  for (std::size_t d = 0; d < count; ++d)
    if (broadcast[d]) {
      if (zero_stride) layout.broadcast[d] = true;
      else full[d] = 1;
    }
  return HostTensor(dtype, full, layout);
}

HostTensor bias_like(const AttentionCase& c, DType dtype) {
  return broadcastable(dtype, {c.num_batches(), c.heads, c.rows_per_batch_q(), c.rows_per_batch_k()},
                       c.bias.broadcast.data(), 4, c.bias.zero_stride);
}

HostTensor rel_like(const AttentionCase& c, DType dtype, std::int64_t width) {
  return broadcastable(dtype, {c.num_batches(), c.heads, c.rows_per_batch_q(), width}, c.rel_broadcast.data(), 3,
                       c.rel_zero_stride);
}

std::int64_t rel_wk(const AttentionCase& c) { return c.rows_per_batch_k() / c.rel_hk; }

// Sums `full` (logical shape `full_shape`) over every dim where `like` broadcasts, and returns it
// in like's logical shape (zero-stride dims repeat the sum, as the aliased elements would).
std::vector<double> reduce_like(const std::vector<double>& full, const std::vector<std::int64_t>& full_shape,
                                const HostTensor& like) {
  const auto& shape = like.shape();
  auto canonical = [&](std::vector<std::int64_t> coords) {
    std::int64_t index = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (like.broadcast_dim(static_cast<int>(d))) coords[d] = 0;
      index = index * shape[d] + coords[d];
    }
    return index;
  };
  std::vector<double> sums(at(like.numel()), 0.0);
  for (std::int64_t i = 0; i < product(full_shape); ++i) sums[at(canonical(unravel(i, full_shape)))] += full[at(i)];
  std::vector<double> result(at(like.numel()));
  for (std::int64_t i = 0; i < like.numel(); ++i) result[at(i)] = sums[at(canonical(unravel(i, shape)))];
  return result;
}

// Expands a possibly size-1-broadcast tensor to `full_shape`.
std::vector<double> expand(const HostTensor& t, const std::vector<std::int64_t>& full_shape) {
  std::vector<double> result(at(product(full_shape)));
  for (std::int64_t i = 0; i < product(full_shape); ++i) {
    auto coords = unravel(i, full_shape);
    std::int64_t src = 0;
    for (std::size_t d = 0; d < coords.size(); ++d) src = src * t.shape()[d] + (t.shape()[d] == 1 ? 0 : coords[d]);
    result[at(i)] = t.at(src);
  }
  return result;
}

double round_fp16(double x) { return round_to(DType::kFloat16, x); }
double round_bf16(double x) { return round_to(DType::kBFloat16, x); }

bool low_precision(DType dtype) { return dtype == DType::kFloat16 || dtype == DType::kBFloat16; }

// The views of one fmha::run call: the host tensors' own, or their copies on a device.
class CallViews {
 public:
  explicit CallViews(CaseDevice* device) : device_(device) {}
  fmha::TensorView operator()(HostTensor& h) {
    if (device_ == nullptr || !h.defined()) return h.view();
    const fmha::TensorView v = device_->upload(h);
    copies_.push_back({&h, v});
    return v;
  }
  void* stream() const { return device_ != nullptr ? device_->stream() : nullptr; }
  // After fmha::run: waits for the device, copies `outputs` back (whatever the status, so that a
  // refused call can be seen to leave them unwritten) and frees every copy.
  Status finish(const Status& status, std::initializer_list<HostTensor*> outputs) {
    if (device_ == nullptr) return status;
    const Status synced = device_->synchronize();
    for (const auto& [host, view] : copies_)
      for (HostTensor* output : outputs)
        if (output == host) device_->download(*host, view);
    device_->release();
    return status.ok() ? synced : status;
  }

 private:
  CaseDevice* device_;
  std::vector<std::pair<HostTensor*, fmha::TensorView>> copies_;
};

fmha::AttentionOptions options_with_tensors(const AttentionCase& c, CaseTensors& t, CallViews& v) {
  fmha::AttentionOptions o = c.options;
  o.bias = v(t.bias);
  o.rel_h = v(t.rel_h);
  o.rel_w = v(t.rel_w);
  o.sinks = v(t.sinks);
  o.extra_k = v(t.extra_k);
  o.extra_v = v(t.extra_v);
  return o;
}

fmha::AttentionGradients gradients(CaseTensors& t, CallViews& v) {
  return {.dq = v(t.dq), .dk = v(t.dk), .dv = v(t.dv), .dbias = v(t.dbias),
          .drel_h = v(t.drel_h), .drel_w = v(t.drel_w), .dsinks = v(t.dsinks),
          .dextra_k = v(t.dextra_k), .dextra_v = v(t.dextra_v)};
}

}  // namespace

naive::Round naive_rounding(DType dtype) {
  if (dtype == DType::kFloat16) return round_fp16;
  if (dtype == DType::kBFloat16) return round_bf16;
  return naive::exact;
}

// x to TF32 (10 mantissa bits; round to nearest even), as the tensor cores read fp32 operands when
// TF32 is allowed.
double round_tf32(double x) {
  const float f = static_cast<float>(x);
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u) return f;  // inf, nan
  bits += 0xfffu + ((bits >> 13) & 1u);
  bits &= ~0x1fffu;
  float r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

std::vector<double> tf32_values(std::vector<double> v) {
  for (double& x : v) x = round_tf32(x);
  return v;
}

// The problem with its product operands in TF32 (the naive computation then rounds S, P, dP and dS too).
naive::Problem tf32_problem(naive::Problem p) {
  for (auto* v : {&p.q, &p.k, &p.v, &p.extra_k, &p.extra_v}) {
    for (double& x : *v) x = round_tf32(x);
  }
  return p;
}

std::int64_t AttentionCase::num_batches() const {
  return kind == Kind::kVarlen ? static_cast<std::int64_t>(seqlens_q.size()) : batch;
}

std::int64_t AttentionCase::rows_per_batch_q() const {
  if (kind == Kind::kDense) return seqlen_q;
  if (kind == Kind::kVarlen) return seqlens_q.empty() ? 0 : *std::max_element(seqlens_q.begin(), seqlens_q.end());
  std::int64_t n = 1;
  for (int r = 0; r < neighborhood.num_dims; ++r) n *= grid[r];
  return n;
}

std::int64_t AttentionCase::rows_per_batch_k() const {
  if (kind == Kind::kDense) return seqlen_k;
  if (kind == Kind::kVarlen) return seqlens_k.empty() ? 0 : *std::max_element(seqlens_k.begin(), seqlens_k.end());
  return rows_per_batch_q();
}

std::string AttentionCase::describe() const {
  std::ostringstream s;
  s << (kind == Kind::kDense ? "dense" : kind == Kind::kVarlen ? "varlen" : "neighborhood") << ' '
    << dtype_name(dtype) << " B=" << batch << " H=" << heads << " Hkv=" << kv_heads << " D=" << head_dim
    << " Dv=" << value_dim;
  if (kind == Kind::kDense) s << " Lq=" << seqlen_q << " Lk=" << seqlen_k;
  if (kind == Kind::kVarlen) {
    s << " seqlens_q={";
    for (auto l : seqlens_q) s << l << ',';
    s << "} seqlens_k={";
    for (auto l : seqlens_k) s << l << ',';
    s << '}';
  }
  if (kind == Kind::kNeighborhood) {
    const auto& n = neighborhood;
    for (int r = 0; r < n.num_dims; ++r)
      s << " axis" << r << "{X=" << grid[r] << " K=" << n.kernel_size[r] << " d=" << n.dilation[r]
        << (n.causal[r] ? " causal" : "") << '}';
  }
  const auto& o = options;
  if (o.scale) s << " scale=" << *o.scale;
  if (o.softcap > 0) s << " softcap=" << o.softcap;
  if (o.causal) s << " causal";
  if (o.causal || o.window_left >= 0 || o.window_right >= 0)
    s << (o.causal_alignment == fmha::CausalAlignment::kBottomRight ? " bottom_right" : " top_left");
  if (o.window_left >= 0 || o.window_right >= 0) s << " window=(" << o.window_left << ',' << o.window_right << ')';
  if (bias.given) {
    s << " bias(broadcast=";
    for (bool b : bias.broadcast) s << b;
    s << (bias.zero_stride ? " stride0)" : " size1)");
  }
  if (rel_hk > 0) {
    s << " rel_pos(Hk=" << rel_hk << " broadcast=";
    for (bool b : rel_broadcast) s << b;
    s << (rel_zero_stride ? " stride0)" : " size1)");
  }
  if (sinks) s << " sinks";
  if (extra > 0) s << " extra=" << extra;
  if (dlse) s << " dlse";
  if (fp32_stats) s << " fp32-stats";
  if (o.deterministic) s << " deterministic";
  if (o.allow_tf32) s << " allow_tf32";
  if (backward_impl == fmha::BackwardImpl::kFused) s << " impl=fused";
  if (backward_impl == fmha::BackwardImpl::kSplit) s << " impl=split";
  if (!lse_output) s << " no-lse";
  else if (!backward) s << " forward-only";
  if (backward && lse_output && !input_grads) s << " dq-dk-dv-only";
  s << " q:" << storage_name(q_storage) << " kv:" << storage_name(kv_storage);
  return s.str();
}

CaseTensors make_tensors(const AttentionCase& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  CaseTensors t;
  const DType dt = c.dtype;
  const int rank = static_cast<int>(token_shape(c, false, 1, 1).size());
  const Layout q_layout = storage_layout(c.q_storage, rank, c.kind);
  const Layout kv_layout = storage_layout(c.kv_storage, rank, c.kind);
  const Layout out_layout = storage_layout(writable(c.q_storage), rank, c.kind);
  const Layout dkv_layout = storage_layout(writable(c.kv_storage), rank, c.kind);

  t.q = HostTensor(dt, token_shape(c, false, c.heads, c.head_dim), q_layout);
  t.k = HostTensor(dt, token_shape(c, true, c.kv_heads, c.head_dim), kv_layout);
  t.v = HostTensor(dt, token_shape(c, true, c.kv_heads, c.value_dim), kv_layout);
  t.q.fill_uniform(rng, -1.5, 1.5);
  t.k.fill_uniform(rng, -1.5, 1.5);
  t.v.fill_uniform(rng, -1, 1);
  t.out = HostTensor(dt, token_shape(c, false, c.heads, c.value_dim), out_layout);
  if (c.lse_output) t.lse = HostTensor(stats_dtype(c), lse_shape(c));

  if (c.kind == Kind::kVarlen) {
    const auto b = static_cast<std::int64_t>(c.seqlens_q.size());
    t.cu_seqlens_q = HostTensor(DType::kInt32, {b + 1});
    t.cu_seqlens_k = HostTensor(DType::kInt32, {b + 1});
    std::int64_t cq = 0, ck = 0;
    for (std::int64_t i = 0; i <= b; ++i) {
      t.cu_seqlens_q.set(i, static_cast<double>(cq));
      t.cu_seqlens_k.set(i, static_cast<double>(ck));
      if (i < b) {
        cq += c.seqlens_q[at(i)];
        ck += c.seqlens_k[at(i)];
      }
    }
  }
  if (c.bias.given) {
    t.bias = bias_like(c, dt);
    t.bias.fill_uniform(rng, -1, 1);
  }
  if (c.rel_hk > 0) {
    t.rel_h = rel_like(c, dt, c.rel_hk);
    t.rel_w = rel_like(c, dt, rel_wk(c));
    t.rel_h.fill_uniform(rng, -1, 1);
    t.rel_w.fill_uniform(rng, -1, 1);
  }
  if (c.sinks) {
    t.sinks = HostTensor(stats_dtype(c), {c.heads});
    t.sinks.fill_uniform(rng, -1, 1);
  }
  if (c.extra > 0) {
    t.extra_k = HostTensor(dt, {c.num_batches(), c.extra, c.kv_heads, c.head_dim});
    t.extra_v = HostTensor(dt, {c.num_batches(), c.extra, c.kv_heads, c.value_dim});
    t.extra_k.fill_uniform(rng, -1.5, 1.5);
    t.extra_v.fill_uniform(rng, -1, 1);
  }
  if (!c.backward || !c.lse_output) return t;
  t.dout = HostTensor(dt, t.out.shape(), out_layout);
  t.dout.fill_uniform(rng, -1, 1);
  if (c.dlse) {
    t.dlse = HostTensor(stats_dtype(c), t.lse.shape());
    t.dlse.fill_uniform(rng, -1, 1);
  }
  t.dq = HostTensor(dt, t.q.shape(), out_layout);
  t.dk = HostTensor(dt, t.k.shape(), dkv_layout);
  t.dv = HostTensor(dt, t.v.shape(), dkv_layout);
  if (!c.input_grads) return t;
  if (t.bias.defined()) t.dbias = bias_like(c, dt);
  if (t.rel_h.defined()) {
    // Size-1 dims broadcast in the gradient too (it gets the sum over them); an output cannot have
    // stride 0, so a stride-0 rel-pos gets a full gradient, per logical element like q / k / v.
    AttentionCase full = c;
    if (c.rel_zero_stride) full.rel_broadcast = {false, false, false};
    t.drel_h = rel_like(full, dt, c.rel_hk);
    t.drel_w = rel_like(full, dt, rel_wk(c));
  }
  if (t.sinks.defined()) t.dsinks = HostTensor(stats_dtype(c), t.sinks.shape());
  if (t.extra_k.defined()) {
    t.dextra_k = HostTensor(dt, t.extra_k.shape());
    t.dextra_v = HostTensor(dt, t.extra_v.shape());
  }
  return t;
}

Status run_forward(const AttentionCase& c, CaseTensors& t, CaseDevice* device) {
  t.out.poison();
  t.lse.poison();
  CallViews v(device);
  const fmha::AttentionOptions o = options_with_tensors(c, t, v);
  Status s = Status::invalid_argument("unknown kind");
  switch (c.kind) {
    case Kind::kDense:
      s = fmha::run(fmha::AttentionForwardParams{
          .q = v(t.q), .k = v(t.k), .v = v(t.v), .out = v(t.out), .lse = v(t.lse), .options = o},
          v.stream());
      break;
    case Kind::kVarlen:
      s = fmha::run(fmha::VarlenForwardParams{
          .q = v(t.q), .k = v(t.k), .v = v(t.v), .cu_seqlens_q = v(t.cu_seqlens_q),
          .cu_seqlens_k = v(t.cu_seqlens_k), .max_seqlen_q = c.rows_per_batch_q(),
          .max_seqlen_k = c.rows_per_batch_k(), .out = v(t.out), .lse = v(t.lse), .options = o},
          v.stream());
      break;
    case Kind::kNeighborhood:
      s = fmha::run(fmha::NeighborhoodForwardParams{
          .q = v(t.q), .k = v(t.k), .v = v(t.v), .out = v(t.out), .lse = v(t.lse),
          .neighborhood = c.neighborhood, .options = o},
          v.stream());
      break;
  }
  return v.finish(s, {&t.out, &t.lse});
}

Status run_backward(const AttentionCase& c, CaseTensors& t, CaseDevice* device) {
  for (HostTensor* g : {&t.dq, &t.dk, &t.dv, &t.dbias, &t.drel_h, &t.drel_w, &t.dsinks, &t.dextra_k, &t.dextra_v})
    if (g->defined()) g->poison();
  CallViews v(device);
  const fmha::AttentionOptions o = options_with_tensors(c, t, v);
  Status s = Status::invalid_argument("unknown kind");
  switch (c.kind) {
    case Kind::kDense:
      s = fmha::run(fmha::AttentionBackwardParams{
          .q = v(t.q), .k = v(t.k), .v = v(t.v), .out = v(t.out), .lse = v(t.lse), .dout = v(t.dout),
          .dlse = v(t.dlse), .options = o, .backward_impl = c.backward_impl, .grads = gradients(t, v)},
          v.stream());
      break;
    case Kind::kVarlen:
      s = fmha::run(fmha::VarlenBackwardParams{
          .q = v(t.q), .k = v(t.k), .v = v(t.v), .cu_seqlens_q = v(t.cu_seqlens_q),
          .cu_seqlens_k = v(t.cu_seqlens_k), .max_seqlen_q = c.rows_per_batch_q(),
          .max_seqlen_k = c.rows_per_batch_k(), .out = v(t.out), .lse = v(t.lse), .dout = v(t.dout),
          .dlse = v(t.dlse), .options = o, .backward_impl = c.backward_impl, .grads = gradients(t, v)},
          v.stream());
      break;
    case Kind::kNeighborhood:
      s = fmha::run(fmha::NeighborhoodBackwardParams{
          .q = v(t.q), .k = v(t.k), .v = v(t.v), .out = v(t.out), .lse = v(t.lse), .dout = v(t.dout),
          .dlse = v(t.dlse), .neighborhood = c.neighborhood, .options = o,
          .backward_impl = c.backward_impl, .grads = gradients(t, v)},
          v.stream());
      break;
  }
  return v.finish(s, {&t.dq, &t.dk, &t.dv, &t.dbias, &t.drel_h, &t.drel_w, &t.dsinks, &t.dextra_k, &t.dextra_v});
}

naive::Problem naive_problem(const AttentionCase& c, const CaseTensors& t) {
  naive::Problem p;
  p.heads = c.heads;
  p.kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.value_dim = c.value_dim;
  p.batch = c.num_batches();
  p.rows_q = t.q.numel() / (c.heads * c.head_dim);
  p.rows_k = t.k.numel() / (c.kv_heads * c.head_dim);
  const std::int64_t nq = c.rows_per_batch_q(), nk = c.rows_per_batch_k();
  if (c.kind == Kind::kVarlen) {
    std::int64_t q0 = 0, k0 = 0;
    for (std::size_t b = 0; b < c.seqlens_q.size(); ++b) {
      p.segments.push_back({static_cast<std::int64_t>(b), q0, c.seqlens_q[b], k0, c.seqlens_k[b]});
      q0 += c.seqlens_q[b];
      k0 += c.seqlens_k[b];
    }
  } else {
    for (std::int64_t b = 0; b < c.batch; ++b) p.segments.push_back({b, b * nq, nq, b * nk, nk});
  }
  p.q = t.q.to_double();
  p.k = t.k.to_double();
  p.v = t.v.to_double();
  p.num_extra = c.extra;
  if (c.extra > 0) {
    p.extra_k = t.extra_k.to_double();
    p.extra_v = t.extra_v.to_double();
  }
  p.bias_rows = nq;
  p.bias_cols = nk;
  if (t.bias.defined()) p.bias = expand(t.bias, {p.batch, c.heads, nq, nk});
  if (t.rel_h.defined()) {
    p.rel_hk = c.rel_hk;
    p.rel_wk = rel_wk(c);
    p.rel_h = expand(t.rel_h, {p.batch, c.heads, nq, p.rel_hk});
    p.rel_w = expand(t.rel_w, {p.batch, c.heads, nq, p.rel_wk});
  }
  if (t.sinks.defined()) p.sinks = t.sinks.to_double();
  // The scale is a float parameter; its default is resolved in float arithmetic, and the oracle uses
  // that same value (even for fp64 problems, where one ulp of the scale exceeds the tolerance).
  const float default_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.scale = c.options.scale ? *c.options.scale : default_scale;
  p.softcap = c.options.softcap;
  if (c.kind == Kind::kNeighborhood) {
    naive::NeighborhoodGeometry g;
    g.rank = c.neighborhood.num_dims;
    for (int r = 0; r < 3; ++r) {
      g.grid[r] = c.grid[r];
      g.kernel[r] = c.neighborhood.kernel_size[r];
      g.dilation[r] = c.neighborhood.dilation[r];
      g.causal[r] = c.neighborhood.causal[r];
    }
    const std::vector<char> mask = naive::neighborhood_mask(g);
    p.mask = [mask](const naive::Segment&) { return mask; };
  } else {
    const fmha::AttentionOptions o = c.options;
    p.mask = [o](const naive::Segment& s) {
      return naive::attention_mask(s.q_len, s.k_len, o.causal,
                                   o.causal_alignment == fmha::CausalAlignment::kBottomRight,
                                   o.window_left, o.window_right);
    };
  }
  return p;
}

namespace {

// Library lse index of naive (row, h).
std::int64_t lse_index(const AttentionCase& c, std::int64_t rows_q, std::int64_t row, std::int64_t h) {
  if (c.kind == Kind::kVarlen) return h * rows_q + row;
  const std::int64_t n = c.rows_per_batch_q();
  return ((row / n) * c.heads + h) * n + row % n;
}

// f with every head's out replaced by `out` ([rows_q, H, Dv], the library's stored out): the
// backward then takes Delta = dO . out - dlse (SPEC §11) from that out.
naive::Forward with_out(const naive::Problem& p, naive::Forward f, const std::vector<double>& out) {
  std::size_t head = 0;
  for (const naive::Segment& s : p.segments)
    for (std::int64_t h = 0; h < p.heads; ++h) {
      naive::HeadForward& hf = f.heads[head++];
      for (std::int64_t i = 0; i < s.q_len; ++i) {
        const std::int64_t row = (s.q_begin + i) * p.heads + h;
        for (std::int64_t c = 0; c < p.value_dim; ++c)
          hf.out(i, c) = out[at(row * p.value_dim + c)];
      }
    }
  f.out = out;
  return f;
}

}  // namespace

std::vector<double> lse_to_library(const AttentionCase& c, const std::vector<double>& naive_lse) {
  const std::int64_t rows = static_cast<std::int64_t>(naive_lse.size()) / c.heads;
  std::vector<double> lib(naive_lse.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t h = 0; h < c.heads; ++h) lib[at(lse_index(c, rows, r, h))] = naive_lse[at(r * c.heads + h)];
  return lib;
}

std::vector<double> lse_from_library(const AttentionCase& c, const std::vector<double>& lib_lse) {
  const std::int64_t rows = static_cast<std::int64_t>(lib_lse.size()) / c.heads;
  std::vector<double> result(lib_lse.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t h = 0; h < c.heads; ++h) result[at(r * c.heads + h)] = lib_lse[at(lse_index(c, rows, r, h))];
  return result;
}

namespace {

// A refusal of a valid call as not supported by the backend: a clear message, outputs unwritten.
void expect_clean_refusal(const Status& s, std::initializer_list<const HostTensor*> outputs) {
  EXPECT_EQ(s.message().rfind("fmha: ", 0), 0u) << "unclear refusal: " << s.message();
  for (const HostTensor* output : outputs)
    EXPECT_TRUE(!output->defined() || output->poisoned()) << "a refused call wrote an output: " << s.message();
}

}  // namespace

void check_case(const AttentionCase& c, std::uint64_t seed, CaseDevice* device, std::string* not_supported) {
  SCOPED_TRACE("case: " + c.describe() + " seed=" + std::to_string(seed));
  CaseTensors t = make_tensors(c, seed);
  const Status fs = run_forward(c, t, device);
  if (not_supported != nullptr && fs.code() == fmha::StatusCode::kNotSupported) {
    expect_clean_refusal(fs, {&t.out, &t.lse});
    *not_supported = fs.message();
    return;
  }
  ASSERT_TRUE(fs.ok()) << "forward refused: " << fs.message();

  const naive::Problem p = naive_problem(c, t);
  const naive::Forward ref = naive::forward(p, naive::exact);
  const bool lowp = low_precision(c.dtype);
  const naive::Round round = naive_rounding(c.dtype);
  const naive::Forward lowp_ref = lowp ? naive::forward(p, round) : naive::Forward{};
  // fp32 with TF32 allowed (opt-in, SPEC §13) on a device: 2e-3, or, where cancellation makes any
  // TF32 computation worse (a gradient that is nearly zero), twice the error of the naive one with
  // TF32 operands and intermediates plus 1e-4, as the 16-bit types are bounded. The CPU backend
  // computes in double whatever the option says, and keeps fp32's bound.
  const bool tf32 = device != nullptr && c.dtype == DType::kFloat32 && c.options.allow_tf32;
  const naive::Problem tf32_p = tf32 ? tf32_problem(p) : naive::Problem{};
  const naive::Forward tf32_ref = tf32 ? naive::forward(tf32_p, round_tf32) : naive::Forward{};
  auto tf32_tol = [&](const std::vector<double>& r, const std::vector<double>& tr) {
    return std::max(2e-3, 2 * fmha_test::compare(tr, r, 0).rel_error + 1e-4);
  };
  auto tol = [&](const std::vector<double>& r, const std::vector<double>& lr, DType storage) {
    return tf32 ? tf32_tol(r, lr) : tolerance(c.dtype, r, lowp ? lr : r, storage);
  };
  // An fp64 problem with fp32 statistics: lse and dsinks are stored in fp32, so they are held to
  // fp32's tolerance. The other gradients keep fp64's: the backward recomputes the forward's
  // statistics in float64 and never reads the caller's out or lse (reference.cpp).
  auto stat_tol = [&](const std::vector<double>& r, const std::vector<double>& lr, DType storage) {
    return c.fp32_stats && c.dtype == DType::kFloat64 ? tolerance(DType::kFloat32) : tol(r, lr, storage);
  };
  const DType dt = c.dtype;
  // lse is stored in fp32 even for low-precision problems: its floor is fp32's.
  EXPECT_TRUE(close("out", t.out.to_double(), ref.out, t.out.shape(),
                    tol(ref.out, tf32 ? tf32_ref.out : lowp_ref.out, dt)));
  EXPECT_EQ(t.out.padding_report(), "") << "out: an element outside the view (padding) was written";
  if (!c.lse_output) return;  // out alone; no backward without the forward's lse
  const auto ref_lse = lse_to_library(c, ref.lse);
  const double lse_tol = stat_tol(
      ref_lse, lowp ? lse_to_library(c, lowp_ref.lse) : tf32 ? lse_to_library(c, tf32_ref.lse) : ref_lse,
      t.lse.dtype());
  EXPECT_TRUE(close("lse", t.lse.to_double(), ref_lse, t.lse.shape(), lse_tol));
  if (!c.backward) return;

  const Status bs = run_backward(c, t, device);
  if (not_supported != nullptr && bs.code() == fmha::StatusCode::kNotSupported) {
    expect_clean_refusal(bs, {&t.dq, &t.dk, &t.dv, &t.dbias, &t.drel_h, &t.drel_w, &t.dsinks, &t.dextra_k,
                              &t.dextra_v});
    *not_supported = bs.message();
    return;
  }
  ASSERT_TRUE(bs.ok()) << "backward refused: " << bs.message();
  const std::vector<double> dout = t.dout.to_double();
  const std::vector<double> dlse = t.dlse.defined() ? lse_from_library(c, t.dlse.to_double()) : std::vector<double>{};
  const naive::Gradients g = naive::backward(p, ref, dout, dlse, naive::exact);
  // The rounded reference of the gradients: the 16-bit types' (lowp) or TF32's.
  const naive::Gradients lg = lowp   ? naive::backward(p, lowp_ref, dout, dlse, round)
                              : tf32 ? naive::backward(tf32_p, tf32_ref, tf32_values(dout), dlse, round_tf32)
                                     : naive::Gradients{};
  // The backward takes Delta = dO . out - dlse (SPEC §11) from the out it is given: the library's
  // stored out, whose fp16 / bf16 rounding the forward's check holds to SPEC §13, while the naive
  // computation takes it from its own rounded out. The two roundings are independent, and where a
  // row's dP - Delta is small against Delta (its probability on one key) a gradient magnifies them
  // many times, so the naive one can be lucky where the library's out is not (a bf16 draw: dextra_k
  // 8.1e-3, of which 7.9e-3 from its out alone, against a naive error of 2.2e-3). out is an input
  // of the backward, and SPEC §13 compares on the same inputs: a gradient's bound adds the error
  // its float64 value takes from the library's out alone. By the triangle inequality, what remains
  // is the backward's own error on its inputs, held to 2 x naive + 1e-4 as before. The same holds
  // for an fp32 out (its rounding, magnified alike, exceeded the flat 1e-5 in ill-conditioned fuzz
  // draws): fp32 gradients are held to 1e-5 on their inputs.
  const bool out_rounded = c.dtype != DType::kFloat64;
  const naive::Gradients from_out =
      out_rounded ? naive::backward(p, with_out(p, ref, t.out.to_double()), dout, dlse, naive::exact)
                  : naive::Gradients{};
  auto grad_tol = [&](const std::vector<double>& r, const std::vector<double>& lr,
                      const std::vector<double>& out_r) {
    return tol(r, lr, dt) + (out_rounded ? fmha_test::compare(out_r, r, 0).rel_error : 0.0);
  };
  for (const auto& [name, grad] : {std::pair{"dq", &t.dq}, {"dk", &t.dk}, {"dv", &t.dv}})
    EXPECT_EQ(grad->padding_report(), "")
        << name << ": an element outside the view (padding) was written";
  EXPECT_TRUE(
      close("dq", t.dq.to_double(), g.dq, t.dq.shape(), grad_tol(g.dq, lg.dq, from_out.dq)));
  EXPECT_TRUE(
      close("dk", t.dk.to_double(), g.dk, t.dk.shape(), grad_tol(g.dk, lg.dk, from_out.dk)));
  EXPECT_TRUE(close("dv", t.dv.to_double(), g.dv, t.dv.shape(), tol(g.dv, lg.dv, dt)));  // no Delta
  if (t.dbias.defined()) {
    const std::vector<std::int64_t> full{p.batch, c.heads, p.bias_rows, p.bias_cols};
    const auto ref_db = reduce_like(g.dbias, full, t.dbias);
    const auto lowp_db = lowp || tf32 ? reduce_like(lg.dbias, full, t.dbias) : ref_db;
    const auto out_db = out_rounded ? reduce_like(from_out.dbias, full, t.dbias) : ref_db;
    EXPECT_TRUE(close("dbias", t.dbias.to_double(), ref_db, t.dbias.shape(),
                      grad_tol(ref_db, lowp_db, out_db)));
  }
  if (t.drel_h.defined()) {
    const std::vector<std::int64_t> full_h{p.batch, c.heads, p.bias_rows, p.rel_hk};
    const std::vector<std::int64_t> full_w{p.batch, c.heads, p.bias_rows, p.rel_wk};
    const auto ref_h = reduce_like(g.drel_h, full_h, t.drel_h), ref_w = reduce_like(g.drel_w, full_w, t.drel_w);
    const auto lowp_h = lowp || tf32 ? reduce_like(lg.drel_h, full_h, t.drel_h) : ref_h;
    const auto lowp_w = lowp || tf32 ? reduce_like(lg.drel_w, full_w, t.drel_w) : ref_w;
    const auto out_h = out_rounded ? reduce_like(from_out.drel_h, full_h, t.drel_h) : ref_h;
    const auto out_w = out_rounded ? reduce_like(from_out.drel_w, full_w, t.drel_w) : ref_w;
    EXPECT_TRUE(close("drel_h", t.drel_h.to_double(), ref_h, t.drel_h.shape(),
                      grad_tol(ref_h, lowp_h, out_h)));
    EXPECT_TRUE(close("drel_w", t.drel_w.to_double(), ref_w, t.drel_w.shape(),
                      grad_tol(ref_w, lowp_w, out_w)));
  }
  if (t.dsinks.defined()) {
    // dsinks = -sum_i P_sink(i) Delta(i) adds terms of both signs, so the out that Delta is taken
    // from moves it most of all: it gets the same allowance as the gradients above.
    const double from_out_error =
        out_rounded ? fmha_test::compare(from_out.dsinks, g.dsinks, 0).rel_error : 0.0;
    const double sink_tol = stat_tol(g.dsinks, lg.dsinks, t.dsinks.dtype()) + from_out_error;  // fp32, as lse
    EXPECT_TRUE(close("dsinks", t.dsinks.to_double(), g.dsinks, t.dsinks.shape(), sink_tol));
  }
  if (t.dextra_k.defined()) {
    EXPECT_TRUE(close("dextra_k", t.dextra_k.to_double(), g.dextra_k, t.dextra_k.shape(),
                      grad_tol(g.dextra_k, lg.dextra_k, from_out.dextra_k)));
    EXPECT_TRUE(close("dextra_v", t.dextra_v.to_double(), g.dextra_v, t.dextra_v.shape(),
                      tol(g.dextra_v, lg.dextra_v, dt)));
  }
}

}  // namespace fmha_test
