// The calls of the invalid draws (fuzz_calls.h): tensors placed in the memory block, a valid call
// of an entry point drawn with every tensor, option and layout it allows, and the call as text.
#include "fuzz_calls.h"

#include <algorithm>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace fmha_fuzz {
namespace {

std::vector<std::int64_t> strides_for(const std::vector<std::int64_t>& shape, const Placement& p) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int> order = p.order;
  if (order.empty())
    for (int d = 0; d < rank; ++d) order.push_back(d);
  std::vector<std::int64_t> stride(shape.size(), 0);
  std::int64_t running = 1;
  for (int pos = rank - 1; pos >= 0; --pos) {
    const auto d = static_cast<std::size_t>(order[static_cast<std::size_t>(pos)]);
    if (d < p.zero.size() && p.zero[d]) continue;
    stride[d] = running;
    running *= std::max<std::int64_t>(shape[d], 1);
    if (pos == rank - 1) running += p.pad;
  }
  return stride;
}

std::string view_string(const TensorView& t) {
  std::ostringstream s;
  if (t.rank == 0) return "-";
  s << fmha::to_string(t.dtype) << '[';
  for (int d = 0; d < t.rank && d < kMaxRank; ++d)
    s << (d ? "," : "") << t.shape[static_cast<std::size_t>(d)];
  s << "]/[";
  for (int d = 0; d < t.rank && d < kMaxRank; ++d)
    s << (d ? "," : "") << t.stride[static_cast<std::size_t>(d)];
  s << ']';
  if (t.device.type != DeviceType::kCPU) s << '@' << fmha::to_string(t.device);
  return s.str();
}

std::string options_string(const fmha::AttentionOptions& o) {
  std::ostringstream s;
  if (o.scale) s << " scale=" << *o.scale;
  if (o.softcap != 0) s << " softcap=" << o.softcap;
  if (o.causal) s << " causal";
  if (o.causal_alignment != fmha::CausalAlignment::kTopLeft) s << " bottom_right";
  if (o.window_left != -1 || o.window_right != -1)
    s << " window=(" << o.window_left << ',' << o.window_right << ')';
  if (o.deterministic) s << " deterministic";
  if (o.allow_tf32) s << " allow_tf32";
  return s.str();
}

class Builder {
 public:
  Builder(Call& call, Dice& dice, Arena& arena) : call_(call), dice_(dice), arena_(arena) {}

  // A tensor in the slot `view` with a random layout allowed for its role: contiguous, padded rows,
  // heads stored outside the tokens (token tensors: `heads_dim` >= 0), or (inputs) a broadcast
  // dimension.
  void tensor(TensorView* view, std::string name, Role role, DType dtype,
              std::vector<std::int64_t> shape, bool required,
              std::initializer_list<int> defines = {}, int heads_dim = -1) {
    Placement p;
    const int rank = static_cast<int>(shape.size());
    const std::int64_t pick = dice_.uniform(0, 9);
    if (pick <= 1) p.pad = dice_.uniform(1, 3);
    if (pick == 2 && heads_dim > 0) {
      p.order = {heads_dim};
      if (heads_dim > 1)
        p.order.insert(p.order.begin(), 0);  // [B, H, tokens..., D]; varlen [H, T, D]
      for (int d = heads_dim > 1 ? 1 : 0; d < rank - 1; ++d)
        if (d != heads_dim) p.order.push_back(d);
      p.order.push_back(rank - 1);
    }
    if (pick == 3 && (role == Role::kInput || role == Role::kStatInput) && rank >= 2) {
      p.zero.assign(shape.size(), false);
      p.zero[static_cast<std::size_t>(dice_.uniform(0, rank - 2))] =
          true;  // broadcast, never the last
    }
    *view = place(arena_, call_.device, dtype, shape, p);
    add(view, std::move(name), role, required, defines);
  }

  // bias / rel-pos: broadcast dimensions by size 1 or by stride 0.
  void broadcast_input(TensorView* view, std::string name, std::vector<std::int64_t> shape,
                       int broadcastable, std::initializer_list<int> defines = {}) {
    const std::vector<std::int64_t> full = shape;
    Placement p;
    p.zero.assign(shape.size(), false);
    for (int d = 0; d < broadcastable; ++d) {
      if (!dice_.chance(0.3)) continue;
      if (dice_.chance(0.5))
        shape[static_cast<std::size_t>(d)] = 1;
      else
        p.zero[static_cast<std::size_t>(d)] = true;
    }
    if (dice_.chance(0.2)) p.pad = dice_.uniform(1, 2);
    *view = place(arena_, call_.device, call_.dtype, shape, p);
    add(view, std::move(name), Role::kBroadcastInput, false, defines);
    std::copy(full.begin(), full.end(), call_.slots.back().full.begin());
  }

  // dbias: the bias's shape, stride 0 exactly where the bias has it on a dimension of size > 1.
  void broadcast_gradient(TensorView* view, const TensorView& bias) {
    Placement p;
    std::vector<std::int64_t> shape(bias.shape.begin(), bias.shape.begin() + bias.rank);
    p.zero.assign(shape.size(), false);
    for (int d = 0; d < bias.rank; ++d)
      p.zero[static_cast<std::size_t>(d)] = bias.shape[static_cast<std::size_t>(d)] > 1 &&
                                            bias.stride[static_cast<std::size_t>(d)] == 0;
    if (dice_.chance(0.2)) p.pad = dice_.uniform(1, 2);
    *view = place(arena_, call_.device, call_.dtype, shape, p);
    add(view, "grads.dbias", Role::kBroadcastGradient, false, {});
  }

  // A plain output with the shape of `like` (rel-pos gradients: the input's own shape).
  void output_like(TensorView* view, std::string name, const TensorView& like) {
    std::vector<std::int64_t> shape(like.shape.begin(), like.shape.begin() + like.rank);
    tensor(view, std::move(name), Role::kOutput, call_.dtype, shape, false);
  }

  void add(TensorView* view, std::string name, Role role, bool required,
           std::initializer_list<int> defines) {
    Slot s;
    s.name = std::move(name);
    s.view = view;
    s.role = role;
    s.required = required;
    for (int d : defines) s.defines[static_cast<std::size_t>(d)] = true;
    for (int d = 0; d < view->rank; ++d)
      s.full[static_cast<std::size_t>(d)] = view->shape[static_cast<std::size_t>(d)];
    call_.slots.push_back(std::move(s));
  }
  // An optional tensor left out: still a slot, so that a malformed "not given" view is tried.
  void absent(TensorView* view, std::string name, Role role) {
    *view = {};
    add(view, std::move(name), role, false, {});
  }

 private:
  Call& call_;
  Dice& dice_;
  Arena& arena_;
};

DType draw_dtype(Dice& dice, const Device& device) {
  const bool cpu = device.type == DeviceType::kCPU;
  switch (dice.uniform(0, cpu ? 4 : 3)) {
    case 0:
      return DType::kFloat16;
    case 1:
      return DType::kBFloat16;
    case 4:
      return DType::kFloat64;
    default:
      return DType::kFloat32;
  }
}

std::int64_t draw_head_dim(Dice& dice, bool may_be_wide) {
  if (may_be_wide && dice.chance(0.08)) return dice.chance(0.5) ? 256 : dice.uniform(33, 256);
  return dice.chance(0.5) ? dice.pick<std::int64_t>({1, 8, 16, 32}) : dice.uniform(1, 24);
}

void draw_options(Dice& dice, fmha::AttentionOptions* o, bool neighborhood) {
  if (dice.chance(0.3)) o->scale = static_cast<float>(dice.real(-2, 2));
  if (dice.chance(0.3)) o->softcap = static_cast<float>(dice.real(0.1, 50));
  if (!neighborhood) {
    o->causal = dice.chance(0.3);
    if (dice.chance(0.5)) o->causal_alignment = fmha::CausalAlignment::kBottomRight;
    if (dice.chance(0.3)) {
      o->window_left = dice.chance(0.1) ? kHuge : dice.uniform(-1, 12);
      o->window_right = dice.chance(0.1) ? kHuge : dice.uniform(-1, 12);
    }
  }
  o->deterministic = dice.chance(0.2);
  o->allow_tf32 = dice.chance(0.1);
}

// The attention entry points share everything but the token dimensions (dense [B, L],
// varlen [total], neighborhood [B, X1, (X2, (X3))]) and the layout arguments.
template <typename P>
void build_attention(Call& call, P& p, Dice& dice, Arena& arena) {
  Builder b(call, dice, arena);
  const Entry e = call.entry;
  const bool backward = is_backward(e);
  const DType dt = call.dtype;
  const std::int64_t hkv = dice.uniform(1, 3), heads = hkv * dice.uniform(1, 3);
  const bool narrow = is_neighborhood(e);
  const std::int64_t d = draw_head_dim(dice, !narrow),
                     dv = dice.chance(0.5) ? d : draw_head_dim(dice, !narrow);
  std::vector<std::int64_t> tokens_q, tokens_k;    // the dimensions before [H, D]
  std::vector<int> defines_q, defines_k;           // which of them q (resp. k) sets
  std::int64_t batch = 0, rows_q = 0, rows_k = 0;  // rows: Lq / max_seqlen_q / grid size
  if constexpr (requires { p.cu_seqlens_q; }) {
    batch = dice.chance(0.05) ? 0 : dice.uniform(1, 3);
    call.offsets_q.assign(1, 0);
    call.offsets_k.assign(1, 0);
    std::int64_t longest_q = 0, longest_k = 0;
    for (std::int64_t i = 0; i < batch; ++i) {
      const std::int64_t lq = dice.chance(0.15) ? 0 : dice.uniform(1, 8),
                         lk = dice.chance(0.15) ? 0 : dice.uniform(1, 8);
      call.offsets_q.push_back(static_cast<std::int32_t>(call.offsets_q.back() + lq));
      call.offsets_k.push_back(static_cast<std::int32_t>(call.offsets_k.back() + lk));
      longest_q = std::max(longest_q, lq);
      longest_k = std::max(longest_k, lk);
    }
    p.max_seqlen_q = rows_q = longest_q + (dice.chance(0.3) ? dice.uniform(1, 3) : 0);
    p.max_seqlen_k = rows_k = longest_k + (dice.chance(0.3) ? dice.uniform(1, 3) : 0);
    tokens_q = {call.offsets_q.back()};
    tokens_k = {call.offsets_k.back()};
    defines_q = {0};
    defines_k = {0};
    call.scalar_names = {"max_seqlen_q", "max_seqlen_k"};
  } else if constexpr (requires { p.neighborhood; }) {
    batch = dice.chance(0.05) ? 0 : dice.uniform(1, 3);
    auto& na = p.neighborhood;
    na.num_dims = static_cast<int>(dice.uniform(1, 3));
    tokens_q = {batch};
    defines_q = {0};
    rows_q = 1;
    for (int r = 0; r < 3; ++r) {
      const auto a = static_cast<std::size_t>(r);
      if (r >= na.num_dims) {  // ignored past num_dims: any value
        if (dice.chance(0.5)) na.kernel_size[a] = dice.pick<std::int64_t>({0, -1, 7, kHuge});
        if (dice.chance(0.5)) na.dilation[a] = dice.pick<std::int64_t>({0, -3, 5, kHuge});
        continue;
      }
      const std::int64_t x = dice.uniform(1, na.num_dims == 1 ? 8 : na.num_dims == 2 ? 5 : 3);
      call.grid[a] = x;
      na.kernel_size[a] = dice.uniform(1, x);
      na.dilation[a] = dice.uniform(1, x / na.kernel_size[a]);
      na.causal[a] = dice.chance(0.3);
      tokens_q.push_back(x);
      defines_q.push_back(r + 1);
      rows_q *= x;
      call.scalar_names.push_back(indexed("kernel_size", r));
      call.scalar_names.push_back(indexed("dilation", r));
    }
    call.scalar_names.push_back("neighborhood.num_dims");
    tokens_k = tokens_q;
    rows_k = rows_q;
  } else {
    batch = dice.chance(0.05) ? 0 : dice.uniform(1, 3);
    rows_q = dice.chance(0.08) ? 0 : dice.uniform(1, 9);
    rows_k = dice.chance(0.08) ? 0 : dice.uniform(1, 9);
    tokens_q = {batch, rows_q};
    tokens_k = {batch, rows_k};
    defines_q = {0, 1};
    defines_k = {1};
  }
  call.batch = is_varlen(e) ? static_cast<std::int64_t>(call.offsets_q.size()) - 1 : batch;
  call.heads = heads;
  call.rows_q = rows_q;
  call.rows_k = rows_k;
  const int token_rank = static_cast<int>(tokens_q.size());
  auto with = [](std::vector<std::int64_t> dims, std::int64_t h, std::int64_t w) {
    dims.push_back(h);
    dims.push_back(w);
    return dims;
  };
  auto dims_plus = [&](std::vector<int> dims, std::initializer_list<int> more) {
    dims.insert(dims.end(), more);
    return dims;
  };
  const int hd = token_rank;  // the head dimension's index
  // Token tensors ([tokens..., H, width]) may store their heads outside the tokens.
  auto make = [&](TensorView* v, const char* name, Role role, DType dtype,
                  std::vector<std::int64_t> shape, bool required, const std::vector<int>& defines) {
    const bool tokens = static_cast<int>(shape.size()) == hd + 2;
    b.tensor(v, name, role, dtype, std::move(shape), required, {}, tokens ? hd : -1);
    for (int x : defines) call.slots.back().defines[static_cast<std::size_t>(x)] = true;
  };
  make(&p.q, "q", Role::kInput, dt, with(tokens_q, heads, d), true,
       dims_plus(defines_q, {hd, hd + 1}));
  call.slots.back().anchor = true;
  make(&p.k, "k", Role::kInput, dt, with(tokens_k, hkv, d), true, dims_plus(defines_k, {hd}));
  make(&p.v, "v", Role::kInput, dt, with(tokens_k, hkv, dv), true, {hd + 1});
  if constexpr (requires { p.cu_seqlens_q; }) {
    const auto n = static_cast<std::int64_t>(call.offsets_q.size());
    p.cu_seqlens_q = place(arena, call.device, DType::kInt32, {n}, {});
    b.add(&p.cu_seqlens_q, "cu_seqlens_q", Role::kIndex, true, {0});
    p.cu_seqlens_k = place(arena, call.device, DType::kInt32, {n}, {});
    b.add(&p.cu_seqlens_k, "cu_seqlens_k", Role::kIndex, true, {});
    call.offsets_q_at = static_cast<unsigned char*>(p.cu_seqlens_q.data);
    call.offsets_k_at = static_cast<unsigned char*>(p.cu_seqlens_k.data);
  }
  const std::vector<std::int64_t> out_shape = with(tokens_q, heads, dv);
  std::vector<std::int64_t> lse_shape;
  if (is_varlen(e)) {
    lse_shape = {heads, tokens_q[0]};
  } else {
    lse_shape = tokens_q;
    lse_shape.insert(lse_shape.begin() + 1, heads);
  }
  make(&p.out, "out", backward ? Role::kInput : Role::kOutput, dt, out_shape, true, {});
  if (backward || dice.chance(0.7)) {
    make(&p.lse, "lse", backward ? Role::kStatInput : Role::kStatOutput, call.stat, lse_shape,
         backward, {});
  } else {
    b.absent(&p.lse, "lse", Role::kStatOutput);
  }
  // Options and their tensors.
  fmha::AttentionOptions& o = p.options;
  draw_options(dice, &o, is_neighborhood(e));
  const std::int64_t nb = call.batch;
  if (call.force_bias_gradient || dice.chance(0.35)) {
    b.broadcast_input(&o.bias, "options.bias", {nb, heads, rows_q, rows_k}, 4);
  } else {
    b.absent(&o.bias, "options.bias", Role::kBroadcastInput);
  }
  if (!is_varlen(e) && rows_k > 0 && dice.chance(0.3)) {
    std::vector<std::int64_t> divisors;
    for (std::int64_t x = 1; x <= rows_k; ++x)
      if (rows_k % x == 0) divisors.push_back(x);
    const std::int64_t hk = divisors[static_cast<std::size_t>(
        dice.uniform(0, static_cast<std::int64_t>(divisors.size()) - 1))];
    b.broadcast_input(&o.rel_h, "options.rel_h", {nb, heads, rows_q, hk}, 3, {3});
    call.slots.back().partners = {"options.rel_w"};
    b.broadcast_input(&o.rel_w, "options.rel_w", {nb, heads, rows_q, rows_k / hk}, 3, {3});
    call.slots.back().partners = {"options.rel_h"};
  } else {
    b.absent(&o.rel_h, "options.rel_h", Role::kBroadcastInput);
    b.absent(&o.rel_w, "options.rel_w", Role::kBroadcastInput);
  }
  if (dice.chance(0.3)) {
    make(&o.sinks, "options.sinks", Role::kStatInput, call.stat, {heads}, false, {});
  } else {
    b.absent(&o.sinks, "options.sinks", Role::kStatInput);
  }
  if (dice.chance(0.3)) {
    const std::int64_t r = dice.uniform(0, 3);
    b.tensor(&o.extra_k, "options.extra_k", Role::kInput, dt, {nb, r, hkv, d}, false, {1});
    call.slots.back().partners = {"options.extra_v"};
    b.tensor(&o.extra_v, "options.extra_v", Role::kInput, dt, {nb, r, hkv, dv}, false);
    call.slots.back().partners = {"options.extra_k"};
  } else {
    b.absent(&o.extra_k, "options.extra_k", Role::kInput);
    b.absent(&o.extra_v, "options.extra_v", Role::kInput);
  }
  if constexpr (requires { p.grads; }) {
    make(&p.dout, "dout", Role::kInput, dt, out_shape, true, {});
    if (dice.chance(0.5)) {
      make(&p.dlse, "dlse", Role::kStatInput, call.stat, lse_shape, false, {});
    } else {
      b.absent(&p.dlse, "dlse", Role::kStatInput);
    }
    p.backward_impl = dice.pick(
        {fmha::BackwardImpl::kAuto, fmha::BackwardImpl::kFused, fmha::BackwardImpl::kSplit});
    auto& g = p.grads;
    make(&g.dq, "grads.dq", Role::kOutput, dt, with(tokens_q, heads, d), true, {});
    make(&g.dk, "grads.dk", Role::kOutput, dt, with(tokens_k, hkv, d), true, {});
    make(&g.dv, "grads.dv", Role::kOutput, dt, with(tokens_k, hkv, dv), true, {});
    // Each optional gradient, when its input is given, half of the time; its input then names it.
    auto needs = [&](const char* input, const char* grad) {
      call.slot(input)->partners.push_back(grad);
    };
    if (o.bias.rank != 0 && (call.force_bias_gradient || dice.chance(0.5))) {
      b.broadcast_gradient(&g.dbias, o.bias);
      needs("options.bias", "grads.dbias");
    } else {
      b.absent(&g.dbias, "grads.dbias", Role::kBroadcastGradient);
    }
    if (o.rel_h.rank != 0 && dice.chance(0.5)) {
      b.output_like(&g.drel_h, "grads.drel_h", o.rel_h);
      b.output_like(&g.drel_w, "grads.drel_w", o.rel_w);
      needs("options.rel_h", "grads.drel_h");
      needs("options.rel_w", "grads.drel_w");
    } else {
      b.absent(&g.drel_h, "grads.drel_h", Role::kOutput);
      b.absent(&g.drel_w, "grads.drel_w", Role::kOutput);
    }
    if (o.sinks.rank != 0 && dice.chance(0.5)) {
      make(&g.dsinks, "grads.dsinks", Role::kStatOutput, call.stat, {heads}, false, {});
      needs("options.sinks", "grads.dsinks");
    } else {
      b.absent(&g.dsinks, "grads.dsinks", Role::kStatOutput);
    }
    if (o.extra_k.rank != 0 && dice.chance(0.5)) {
      b.output_like(&g.dextra_k, "grads.dextra_k", o.extra_k);
      b.output_like(&g.dextra_v, "grads.dextra_v", o.extra_v);
      needs("options.extra_k", "grads.dextra_k");
      needs("options.extra_v", "grads.dextra_v");
    } else {
      b.absent(&g.dextra_k, "grads.dextra_k", Role::kOutput);
      b.absent(&g.dextra_v, "grads.dextra_v", Role::kOutput);
    }
  }
}

template <typename P>
void build_merge(Call& call, P& p, Dice& dice, Arena& arena) {
  Builder b(call, dice, arena);
  const std::int64_t batch = dice.chance(0.05) ? 0 : dice.uniform(1, 3),
                     rows = dice.chance(0.05) ? 0 : dice.uniform(1, 9);
  const std::int64_t heads = dice.uniform(1, 6), dv = draw_head_dim(dice, true);
  const std::int64_t parts = dice.uniform(1, 4);
  const DType dt = call.dtype;
  const std::vector<std::int64_t> out_shape{batch, rows, heads, dv}, lse_shape{batch, heads, rows};
  const bool backward = is_backward(call.entry);
  // The vectors keep room for the parts a corruption adds, so that the slots stay valid.
  for (auto* list : {&p.outs, &p.lses}) list->reserve(static_cast<std::size_t>(parts) + 2);
  p.outs.resize(static_cast<std::size_t>(parts));
  p.lses.resize(static_cast<std::size_t>(parts));
  b.tensor(&p.out, "out", backward ? Role::kInput : Role::kOutput, dt, out_shape, true,
           {0, 1, 2, 3}, 2);
  call.slots.back().anchor = true;
  b.tensor(&p.lse, "lse", backward ? Role::kStatInput : Role::kStatOutput, call.stat, lse_shape,
           true);
  for (std::int64_t i = 0; i < parts; ++i) {
    const auto at = static_cast<std::size_t>(i);
    b.tensor(&p.outs[at], indexed("outs", i), Role::kInput, dt, out_shape, true, {}, 2);
    b.tensor(&p.lses[at], indexed("lses", i), Role::kStatInput, call.stat, lse_shape, true);
  }
  if constexpr (requires { p.douts; }) {
    b.tensor(&p.dout, "dout", Role::kInput, dt, out_shape, true, {}, 2);
    if (dice.chance(0.5)) {
      b.tensor(&p.dlse, "dlse", Role::kStatInput, call.stat, lse_shape, false);
    } else {
      b.absent(&p.dlse, "dlse", Role::kStatInput);
    }
    for (auto* list : {&p.douts, &p.dlses}) list->reserve(static_cast<std::size_t>(parts) + 2);
    p.douts.resize(static_cast<std::size_t>(parts));
    p.dlses.resize(static_cast<std::size_t>(parts));
    for (std::int64_t i = 0; i < parts; ++i) {
      const auto at = static_cast<std::size_t>(i);
      b.tensor(&p.douts[at], indexed("douts", i), Role::kOutput, dt, out_shape, true, {}, 2);
      b.tensor(&p.dlses[at], indexed("dlses", i), Role::kStatOutput, call.stat, lse_shape, true);
    }
  }
  call.scalar_names = {"outs", "lses", "douts", "dlses"};
}

}  // namespace

std::string indexed(const std::string& name, std::int64_t i) {
  std::ostringstream s;
  s << name << '[' << i << ']';
  return s.str();
}

TensorView place(Arena& arena, Device device, DType dtype, const std::vector<std::int64_t>& shape,
                 const Placement& placement) {
  const std::vector<std::int64_t> stride = strides_for(shape, placement);
  std::int64_t elements = 1;
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 0) elements += (shape[d] - 1) * stride[d];
  unsigned char* data = arena.take(static_cast<std::size_t>(elements) * fmha::element_size(dtype));
  return TensorView::strided(data, dtype, static_cast<int>(shape.size()), shape.data(),
                             stride.data(), device);
}

const char* entry_name(Entry e) {
  static constexpr const char* kNames[kEntries] = {
      "dense-forward", "dense-backward", "varlen-forward", "varlen-backward",
      "na-forward",    "na-backward",    "merge-forward",  "merge-backward"};
  return kNames[static_cast<int>(e)];
}

std::string describe(Call& call) {
  std::ostringstream s;
  s << entry_name(call.entry);
  for (const Slot& slot : call.slots)
    if (slot.view->rank != 0) s << ' ' << slot.name << '=' << view_string(*slot.view);
  std::visit(
      [&](auto& p) {
        if constexpr (requires { p.max_seqlen_q; })
          s << " max_seqlen_q=" << p.max_seqlen_q << " max_seqlen_k=" << p.max_seqlen_k;
        if constexpr (requires { p.neighborhood; }) {
          const auto& n = p.neighborhood;
          s << " num_dims=" << n.num_dims;
          for (int r = 0; r < 3; ++r) {
            const auto a = static_cast<std::size_t>(r);
            s << " axis" << r << "(K=" << n.kernel_size[a] << ",d=" << n.dilation[a]
              << (n.causal[a] ? ",causal" : "") << ')';
          }
        }
        if constexpr (requires { p.options; }) s << options_string(p.options);
        if constexpr (requires { p.backward_impl; })
          if (p.backward_impl != fmha::BackwardImpl::kAuto)
            s << " backward_impl=" << static_cast<int>(p.backward_impl);
      },
      call.params);
  if (!call.offsets_q.empty()) {
    s << " cu_seqlens_q={";
    for (auto o : call.offsets_q) s << o << ',';
    s << "} cu_seqlens_k={";
    for (auto o : call.offsets_k) s << o << ',';
    s << '}';
  }
  return s.str();
}

void build(Call& call, Entry entry, Dice& dice, Arena& arena, Device device) {
  call.entry = entry;
  call.device = device;
  call.reads_offsets = device.type == DeviceType::kCPU;
  call.dtype = draw_dtype(dice, device);
  call.stat = call.dtype == DType::kFloat64 && dice.chance(0.5) ? DType::kFloat64 : DType::kFloat32;
  switch (entry) {
    case Entry::kDenseForward:
      build_attention(call, call.params.emplace<fmha::AttentionForwardParams>(), dice, arena);
      break;
    case Entry::kDenseBackward:
      build_attention(call, call.params.emplace<fmha::AttentionBackwardParams>(), dice, arena);
      break;
    case Entry::kVarlenForward:
      build_attention(call, call.params.emplace<fmha::VarlenForwardParams>(), dice, arena);
      break;
    case Entry::kVarlenBackward:
      build_attention(call, call.params.emplace<fmha::VarlenBackwardParams>(), dice, arena);
      break;
    case Entry::kNeighborhoodForward:
      build_attention(call, call.params.emplace<fmha::NeighborhoodForwardParams>(), dice, arena);
      break;
    case Entry::kNeighborhoodBackward:
      build_attention(call, call.params.emplace<fmha::NeighborhoodBackwardParams>(), dice, arena);
      break;
    case Entry::kMergeForward:
      build_merge(call, call.params.emplace<fmha::MergeForwardParams>(), dice, arena);
      break;
    case Entry::kMergeBackward:
      build_merge(call, call.params.emplace<fmha::MergeBackwardParams>(), dice, arena);
      break;
  }
}

}  // namespace fmha_fuzz
