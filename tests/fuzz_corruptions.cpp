// The corruptions of the invalid draws (fuzz_corruptions.h): a wrong shape, rank, dtype, stride,
// device or data pointer; a missing tensor, half of a pair, a gradient without its input; an output
// that broadcasts or overlaps itself; an option out of range; bad cu_seqlens values; ...
#include "fuzz_corruptions.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <variant>
#include <vector>

namespace fmha_fuzz {

const char* kind_name(Kind k) {
  static constexpr const char* kNames[kKinds] = {"missing",
                                                 "rank",
                                                 "rank-out-of-range",
                                                 "dtype",
                                                 "dtype-unknown",
                                                 "device",
                                                 "call-device",
                                                 "float64-on-cuda",
                                                 "shape",
                                                 "negative-size",
                                                 "huge-size",
                                                 "negative-stride",
                                                 "last-stride",
                                                 "overflow-stride",
                                                 "output-broadcast",
                                                 "output-overlap",
                                                 "dbias-broadcast",
                                                 "null-data",
                                                 "misaligned",
                                                 "orphan-gradient",
                                                 "option",
                                                 "neighborhood",
                                                 "max-seqlen",
                                                 "offsets",
                                                 "varlen-rel-pos",
                                                 "part-count"};
  return kNames[static_cast<int>(k)];
}

bool fits(Kind k, Entry e) {
  switch (k) {
    case Kind::kOffsets:
    case Kind::kMaxSeqlen:
    case Kind::kVarlenRelPos:
      return is_varlen(e);
    case Kind::kNeighborhood:
      return is_neighborhood(e);
    case Kind::kPartCount:
      return is_merge(e);
    case Kind::kBroadcastGradient:
    case Kind::kOrphanGradient:
      return is_backward(e) && !is_merge(e);
    case Kind::kOption:
      return !is_merge(e);
    default:
      return true;
  }
}
bool fits(Kind k, const Device& device) {
  return k != Kind::kOffsets || device.type == DeviceType::kCPU;
}

namespace {

std::int64_t numel(const TensorView& t) {
  std::int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) n *= t.shape[static_cast<std::size_t>(d)];
  return n;
}

class Corruptor {
 public:
  Corruptor(Call& call, Dice& dice, Arena& arena) : call_(call), dice_(dice), arena_(arena) {}

  // Applies corruption `kind` when it fits the call; false when it does not.
  bool apply(Kind kind, Expected* x) {
    switch (kind) {
      case Kind::kMissing:
        return missing(x);
      case Kind::kRank:
        return rank(x);
      case Kind::kRankOutOfRange:
        return rank_out_of_range(x);
      case Kind::kDtype:
        return dtype(x);
      case Kind::kDtypeUnknown:
        return dtype_unknown(x);
      case Kind::kDevice:
        return device(x);
      case Kind::kCallDevice:
        return call_device(x);
      case Kind::kFloat64OnCuda:
        return float64_on_cuda(x);
      case Kind::kShape:
        return shape(x);
      case Kind::kNegativeSize:
        return negative_size(x);
      case Kind::kHugeSize:
        return huge_size(x);
      case Kind::kNegativeStride:
        return negative_stride(x);
      case Kind::kLastStride:
        return last_stride(x);
      case Kind::kOverflowStride:
        return overflow_stride(x);
      case Kind::kOutputBroadcast:
        return output_broadcast(x);
      case Kind::kOutputOverlap:
        return output_overlap(x);
      case Kind::kBroadcastGradient:
        return broadcast_gradient(x);
      case Kind::kNullData:
        return null_data(x);
      case Kind::kMisaligned:
        return misaligned(x);
      case Kind::kOrphanGradient:
        return orphan_gradient(x);
      case Kind::kOption:
        return option(x);
      case Kind::kNeighborhood:
        return neighborhood(x);
      case Kind::kMaxSeqlen:
        return max_seqlen(x);
      case Kind::kOffsets:
        return offsets(x);
      case Kind::kVarlenRelPos:
        return varlen_rel_pos(x);
      case Kind::kPartCount:
        return part_count(x);
    }
    return false;
  }

 private:
  Slot* pick(const std::function<bool(const Slot&)>& fits) {
    std::vector<Slot*> candidates;
    for (Slot& s : call_.slots)
      if (fits(s)) candidates.push_back(&s);
    if (candidates.empty()) return nullptr;
    return candidates[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(candidates.size()) - 1))];
  }
  static bool given(const Slot& s) { return s.view->rank != 0; }
  static bool has_elements(const Slot& s) { return given(s) && numel(*s.view) > 0; }
  Slot* anchor() {
    for (Slot& s : call_.slots)
      if (s.anchor) return &s;
    return nullptr;
  }
  // A dimension of `s` for which `fits(d)` holds, or -1.
  int pick_dim(const Slot& s, const std::function<bool(int)>& fits) {
    std::vector<int> dims;
    for (int d = 0; d < s.view->rank; ++d)
      if (fits(d)) dims.push_back(d);
    if (dims.empty()) return -1;
    return dims[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(dims.size()) - 1))];
  }
  static std::int64_t& size(Slot& s, int d) { return s.view->shape[static_cast<std::size_t>(d)]; }
  static std::int64_t& stride(Slot& s, int d) {
    return s.view->stride[static_cast<std::size_t>(d)];
  }
  void named(Expected* x, const Slot& s, const std::string& what) {
    x->names.push_back(s.name);
    x->what = s.name + ": " + what;
  }

  bool missing(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s) && (s.required || !s.partners.empty()); });
    if (!s) return false;
    *s->view = {};
    named(x, *s, "not given");
    for (const auto& p : s->partners) x->names.push_back(p);
    return true;
  }

  bool rank(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    TensorView& t = *s->view;
    const bool grow = t.rank == 1 || (t.rank < kMaxRank && dice_.chance(0.5));
    if (grow) {
      t.shape[static_cast<std::size_t>(t.rank)] = 1;
      t.stride[static_cast<std::size_t>(t.rank)] = 1;
      ++t.rank;
    } else {
      --t.rank;
    }
    named(x, *s, "rank " + std::to_string(t.rank));
    return true;
  }

  bool rank_out_of_range(Expected* x) {
    Slot* s = pick([](const Slot&) { return true; });
    if (!s) return false;
    const int r = dice_.pick<int>({-1, -2, -100, std::numeric_limits<int>::min(), kMaxRank + 1,
                                   kMaxRank + 2, 64, 1000, std::numeric_limits<int>::max()});
    s->view->rank = r;
    named(x, *s, "rank " + std::to_string(r) + (given(*s) ? "" : " on a view that was not given"));
    return true;
  }

  // A dtype the slot's role refuses.
  bool dtype(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    std::vector<DType> refused;
    for (DType d :
         {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32}) {
      bool accepted = false;
      if (s->role == Role::kIndex)
        accepted = d == DType::kInt32;
      else if (is_stat(s->role))
        accepted = d == DType::kFloat32 || (d == DType::kFloat64 && call_.dtype == DType::kFloat64);
      else
        accepted = d == s->view->dtype;  // data tensors: the anchor's dtype (the anchor: its own)
      if (!accepted) refused.push_back(d);
    }
    const DType d = refused[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(refused.size()) - 1))];
    s->view->dtype = d;
    named(x, *s, std::string("dtype ") + fmha::to_string(d));
    if (s->anchor && d == DType::kFloat64 && call_.device.type != DeviceType::kCPU)
      x->code = StatusCode::kNotSupported;
    return true;
  }

  bool dtype_unknown(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    const int value = static_cast<int>(dice_.uniform(5, 255));
    s->view->dtype = static_cast<DType>(value);
    named(x, *s, "dtype value " + std::to_string(value));
    return true;
  }

  Device other_device(const Device& now) {
    std::vector<Device> choices{Device::cuda(0),
                                Device::cuda(1),
                                Device::cpu(),
                                {DeviceType::kCPU, 1},
                                {static_cast<DeviceType>(dice_.uniform(2, 255)), 0},
                                {DeviceType::kCUDA, -1}};
    std::vector<Device> others;
    for (const Device& d : choices)
      if (d != now) others.push_back(d);
    return others[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(others.size()) - 1))];
  }
  static std::string device_string(const Device& d) {
    return "device type " + std::to_string(static_cast<int>(d.type)) + " index " +
           std::to_string(d.index);
  }

  bool device(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    const Device d = other_device(s->view->device);
    s->view->device = d;
    named(x, *s, "on " + device_string(d));
    if (s->anchor && call_.dtype == DType::kFloat64 && d.type == DeviceType::kCUDA && d.index >= 0)
      x->code = StatusCode::kNotSupported;
    return true;
  }

  // Every tensor on a device that does not exist.
  bool call_device(Expected* x) {
    const Device d = dice_.chance(0.5)
                         ? Device{static_cast<DeviceType>(dice_.uniform(2, 255)), 0}
                         : Device{DeviceType::kCUDA, static_cast<int>(dice_.uniform(-1000, -1))};
    for (Slot& s : call_.slots)
      if (given(s)) s.view->device = d;
    named(x, *anchor(), "every tensor on " + device_string(d));
    return true;
  }

  // Every data tensor float64 (statistics float32) on a CUDA device: refused as not supported.
  bool float64_on_cuda(Expected* x) {
    const Device cuda = call_.device.type == DeviceType::kCUDA ? call_.device : Device::cuda(0);
    for (Slot& s : call_.slots) {
      if (!given(s)) continue;
      s.view->device = cuda;
      if (s.role == Role::kIndex) continue;
      s.view->dtype = is_stat(s.role) ? DType::kFloat32 : DType::kFloat64;
    }
    named(x, *anchor(), "float64 on " + fmha::to_string(cuda));
    x->code = StatusCode::kNotSupported;
    return true;
  }

  bool shape(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    const int d = static_cast<int>(dice_.uniform(0, s->view->rank - 1));
    const std::int64_t old = size(*s, d);
    std::vector<std::int64_t> sizes;
    for (std::int64_t n : {old + 1, old + 2, old - 1, std::int64_t{0}, 2 * old + 3}) {
      if (n < 0 || n == old || std::find(sizes.begin(), sizes.end(), n) != sizes.end()) continue;
      // A broadcast input passes with the full size or 1.
      if (s->role == Role::kBroadcastInput && (n == 1 || n == s->full[static_cast<std::size_t>(d)]))
        continue;
      sizes.push_back(n);
    }
    const std::int64_t n = sizes[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(sizes.size()) - 1))];
    size(*s, d) = n;
    named(x, *s,
          "size " + std::to_string(n) + " instead of " + std::to_string(old) + " on dimension " +
              std::to_string(d));
    x->any_name = s->defines[static_cast<std::size_t>(d)];
    return true;
  }

  bool negative_size(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    const int d = static_cast<int>(dice_.uniform(0, s->view->rank - 1));
    size(*s, d) = -dice_.uniform(1, 9);
    named(x, *s, "size " + std::to_string(size(*s, d)) + " on dimension " + std::to_string(d));
    return true;
  }

  // A size whose element count overflows int64.
  bool huge_size(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s) && s.view->rank >= 2; });
    if (!s) return false;
    const int d = static_cast<int>(dice_.uniform(0, s->view->rank - 1));
    const int other = (d + 1) % s->view->rank;
    size(*s, d) = kHuge + dice_.uniform(0, 5);
    if (size(*s, other) < 2) size(*s, other) = 2;
    named(x, *s, "size " + std::to_string(size(*s, d)) + " on dimension " + std::to_string(d));
    // With a zero size elsewhere the count does not overflow: then it is a size q or k sets for
    // others.
    x->any_name = s->defines[static_cast<std::size_t>(d)];
    return true;
  }

  bool negative_stride(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    const int d = static_cast<int>(dice_.uniform(0, s->view->rank - 1));
    stride(*s, d) = -dice_.uniform(1, 100);
    named(x, *s, "stride " + std::to_string(stride(*s, d)) + " on dimension " + std::to_string(d));
    return true;
  }

  // The last dimension (size > 1) not contiguous.
  bool last_stride(Expected* x) {
    Slot* s = pick([](const Slot& s) { return has_elements(s) && s.view->size(-1) > 1; });
    if (!s) return false;
    const int last = s->view->rank - 1;
    std::vector<std::int64_t> strides{2, 3, s->view->size(-1) + 1};
    const bool zero_is_valid = s->role == Role::kBroadcastInput ||
                               (s->role == Role::kBroadcastGradient && stride(*s, last) == 0);
    if (!zero_is_valid) strides.push_back(0);
    if (s->role == Role::kBroadcastGradient && stride(*s, last) == 0) strides.push_back(1);
    const std::int64_t n = strides[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(strides.size()) - 1))];
    stride(*s, last) = n;
    named(x, *s, "stride " + std::to_string(n) + " on the last dimension");
    return true;
  }

  bool overflow_stride(Expected* x) {
    Slot* s = pick([](const Slot& s) {
      if (!has_elements(s)) return false;
      for (int d = 0; d < s.view->rank; ++d)
        if (s.view->shape[static_cast<std::size_t>(d)] >= 3) return true;
      return false;
    });
    if (!s) return false;
    const int d = pick_dim(*s, [&](int d) { return size(*s, d) >= 3; });
    stride(*s, d) = kHuge + dice_.uniform(0, 99);
    named(x, *s, "stride " + std::to_string(stride(*s, d)) + " on dimension " + std::to_string(d));
    return true;
  }

  // An output broadcast over a dimension: its elements share memory.
  bool output_broadcast(Expected* x) {
    auto fits = [](const Slot& s) {
      if (!has_elements(s) || !(s.role == Role::kOutput || s.role == Role::kStatOutput))
        return false;
      for (int d = 0; d + 1 < s.view->rank; ++d)
        if (s.view->shape[static_cast<std::size_t>(d)] > 1) return true;
      return false;
    };
    Slot* s = pick(fits);
    if (!s) return false;
    const int d = pick_dim(*s, [&](int d) { return d + 1 < s->view->rank && size(*s, d) > 1; });
    stride(*s, d) = 0;
    named(x, *s, "stride 0 on dimension " + std::to_string(d) + " of an output");
    return true;
  }

  // An output whose strides send two elements to one address.
  bool output_overlap(Expected* x) {
    auto spans = [](const Slot& s, int d) {
      return s.view->shape[static_cast<std::size_t>(d)] > 1 &&
             s.view->stride[static_cast<std::size_t>(d)] != 0;
    };
    auto fits = [&](const Slot& s) {
      if (!has_elements(s) || !is_output(s.role)) return false;
      int n = 0;
      for (int d = 0; d < s.view->rank; ++d) n += spans(s, d);
      return n >= 2;
    };
    Slot* s = pick(fits);
    if (!s) return false;
    const int d1 = pick_dim(*s, [&](int d) { return spans(*s, d) && d + 1 < s->view->rank; });
    if (d1 < 0) return false;
    const int d2 = pick_dim(*s, [&](int d) { return spans(*s, d) && d != d1; });
    stride(*s, d1) = stride(*s, d2);
    named(x, *s,
          "stride of dimension " + std::to_string(d1) + " = that of dimension " +
              std::to_string(d2) + " (elements share memory)");
    return true;
  }

  // dbias zero-strided where bias is not, or the reverse.
  bool broadcast_gradient(Expected* x) {
    Slot* db = call_.slot("grads.dbias");
    Slot* bias = call_.slot("options.bias");
    if (!db || !bias || !has_elements(*db)) return false;
    const int d =
        pick_dim(*bias, [&](int d) { return size(*bias, d) > 1 && stride(*bias, d) != 0; });
    if (d < 0) return false;
    if (dice_.chance(0.5)) {
      stride(*db, d) = 0;
      named(x, *db, "stride 0 on dimension " + std::to_string(d) + " where options.bias has none");
    } else {
      stride(*bias, d) = 0;
      named(x, *db,
            "dense on dimension " + std::to_string(d) + " where options.bias is made stride 0");
    }
    return true;
  }

  bool null_data(Expected* x) {
    Slot* s = pick(has_elements);
    if (!s) return false;
    s->view->data = nullptr;
    named(x, *s, "null data");
    return true;
  }

  bool misaligned(Expected* x) {
    Slot* s = pick(
        [](const Slot& s) { return has_elements(s) && fmha::element_size(s.view->dtype) > 1; });
    if (!s) return false;
    const auto offset =
        dice_.uniform(1, static_cast<std::int64_t>(fmha::element_size(s->view->dtype)) - 1);
    s->view->data = static_cast<unsigned char*>(s->view->data) + offset;
    named(x, *s, "data misaligned by " + std::to_string(offset) + " bytes");
    return true;
  }

  // A gradient given without its input (rel-pos and extra keys: without either half of the pair).
  bool orphan_gradient(Expected* x) {
    std::vector<std::vector<std::string>> groups;
    for (const auto& g : std::vector<std::vector<std::string>>{
             {"options.bias", "grads.dbias"},
             {"options.rel_h", "options.rel_w", "grads.drel_h"},
             {"options.sinks", "grads.dsinks"},
             {"options.extra_k", "options.extra_v", "grads.dextra_k"}}) {
      Slot* grad = call_.slot(g.back());
      if (grad && given(*grad)) groups.push_back(g);
    }
    if (groups.empty()) return false;
    const auto& g = groups[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(groups.size()) - 1))];
    for (std::size_t i = 0; i + 1 < g.size(); ++i) *call_.slot(g[i])->view = {};
    x->names = g;
    if (g.size() == 3)
      x->names.push_back(g[2] == "grads.drel_h" ? "grads.drel_w" : "grads.dextra_v");
    x->what = g.back() + " given without its input";
    return true;
  }

  // An attention option out of range.
  bool option(Expected* x) {
    fmha::AttentionOptions* o = call_.options();
    if (!o) return false;
    const float nan = std::numeric_limits<float>::quiet_NaN(),
                inf = std::numeric_limits<float>::infinity();
    const bool backward = is_backward(call_.entry);
    switch (dice_.uniform(0, backward ? 5 : 4)) {
      case 0:
      case 1: {
        const bool left = dice_.chance(0.5);
        std::int64_t& w = left ? o->window_left : o->window_right;
        w = dice_.pick<std::int64_t>({-2, -3, -100, std::numeric_limits<std::int64_t>::min()});
        x->names = {left ? "options.window_left" : "options.window_right"};
        x->what = x->names[0] + " = " + std::to_string(w);
        break;
      }
      case 2:
        o->softcap = dice_.pick<float>({-1.0f, -1e-30f, nan, inf, -inf});
        x->names = {"options.softcap"};
        x->what = "options.softcap = " + std::to_string(o->softcap);
        break;
      case 3:
        o->scale = dice_.pick<float>({nan, inf, -inf});
        x->names = {"options.scale"};
        x->what = "options.scale = " + std::to_string(*o->scale);
        break;
      case 4: {
        const int v = static_cast<int>(dice_.uniform(2, 255));
        o->causal_alignment = static_cast<fmha::CausalAlignment>(v);
        x->names = {"options.causal_alignment"};
        x->what = "options.causal_alignment = " + std::to_string(v);
        break;
      }
      default: {
        const int v = static_cast<int>(dice_.uniform(3, 255));
        std::visit(
            [&](auto& p) {
              if constexpr (requires { p.backward_impl; })
                p.backward_impl = static_cast<fmha::BackwardImpl>(v);
            },
            call_.params);
        x->names = {"backward_impl"};
        x->what = "backward_impl = " + std::to_string(v);
        break;
      }
    }
    return true;
  }

  // Neighborhood arguments: num_dims, kernel_size, dilation, and the sequence masks it refuses.
  bool neighborhood(Expected* x) {
    if (!is_neighborhood(call_.entry)) return false;
    fmha::NeighborhoodOptions* na = nullptr;
    std::visit(
        [&](auto& p) {
          if constexpr (requires { p.neighborhood; }) na = &p.neighborhood;
        },
        call_.params);
    fmha::AttentionOptions* o = call_.options();
    const int r = static_cast<int>(dice_.uniform(0, na->num_dims - 1));
    const auto a = static_cast<std::size_t>(r);
    const std::string kernel = indexed("kernel_size", r), dilation = indexed("dilation", r);
    switch (dice_.uniform(0, 6)) {
      case 0: {  // out of range, or another valid count that disagrees with q's rank
        const int n = dice_.chance(0.5) ? dice_.pick<int>({0, -1, 4, 100}) : (na->num_dims % 3) + 1;
        na->num_dims = n;
        x->names = {"neighborhood.num_dims", "q"};
        x->what = "neighborhood.num_dims = " + std::to_string(n);
        break;
      }
      case 1:
        na->kernel_size[a] = -dice_.uniform(0, 3);
        x->names = {kernel};
        x->what = kernel + " = " + std::to_string(na->kernel_size[a]);
        break;
      case 2:
        na->dilation[a] = -dice_.uniform(0, 3);
        x->names = {dilation};
        x->what = dilation + " = " + std::to_string(na->dilation[a]);
        break;
      case 3:  // the window wider than the grid
        if (dice_.chance(0.5))
          na->kernel_size[a] = call_.grid[a] / na->dilation[a] + 1;
        else
          na->dilation[a] = call_.grid[a] / na->kernel_size[a] + 1;
        x->names = {kernel, dilation};
        x->what = kernel + " * " + dilation + " = " + std::to_string(na->kernel_size[a]) + " * " +
                  std::to_string(na->dilation[a]) + " > grid " + std::to_string(call_.grid[a]);
        break;
      case 4:
        na->dilation[a] = kHuge;
        x->names = {kernel, dilation};
        x->what = dilation + " = 2^62";
        break;
      case 5:
        o->causal = true;
        x->names = {"options.causal"};
        x->what = "options.causal = true in neighborhood attention";
        break;
      default: {
        const bool left = dice_.chance(0.5);
        (left ? o->window_left : o->window_right) = dice_.uniform(0, 5);
        x->names = {left ? "options.window_left" : "options.window_right"};
        x->what = x->names[0] + " set in neighborhood attention";
        break;
      }
    }
    return true;
  }

  // max_seqlen negative, or (CPU, where the offsets are read) shorter than a sequence.
  bool max_seqlen(Expected* x) {
    if (!is_varlen(call_.entry)) return false;
    const bool q = dice_.chance(0.5);
    const std::vector<std::int32_t>& offsets = q ? call_.offsets_q : call_.offsets_k;
    std::int64_t longest = 0;
    for (std::size_t i = 1; i < offsets.size(); ++i)
      longest = std::max<std::int64_t>(longest, offsets[i] - offsets[i - 1]);
    std::int64_t value = -dice_.uniform(1, 5);
    if (call_.reads_offsets && longest > 0 && dice_.chance(0.5))
      value = dice_.uniform(0, longest - 1);
    std::visit(
        [&](auto& p) {
          if constexpr (requires { p.max_seqlen_q; }) (q ? p.max_seqlen_q : p.max_seqlen_k) = value;
        },
        call_.params);
    const std::string name = q ? "max_seqlen_q" : "max_seqlen_k";
    x->names = {name, q ? "cu_seqlens_q" : "cu_seqlens_k"};
    x->what = name + " = " + std::to_string(value) + " (longest sequence " +
              std::to_string(longest) + ")";
    return true;
  }

  // cu_seqlens values that are not offsets of the rows (read on the CPU only).
  bool offsets(Expected* x) {
    if (!is_varlen(call_.entry) || !call_.reads_offsets) return false;
    const bool q = dice_.chance(0.5);
    std::vector<std::int32_t>& o = q ? call_.offsets_q : call_.offsets_k;
    const auto n = static_cast<std::int64_t>(o.size());
    const std::string name = q ? "cu_seqlens_q" : "cu_seqlens_k";
    std::string what;
    switch (n == 1 ? dice_.uniform(0, 1) : dice_.uniform(0, 3)) {
      case 0:
        o[0] = static_cast<std::int32_t>(
            dice_.pick<std::int64_t>({1, 2, -1, std::numeric_limits<std::int32_t>::max()}));
        what = "[0] = " + std::to_string(o[0]);
        break;
      case 1: {  // the last offset is not the row count
        std::int32_t& last = o.back();
        last = static_cast<std::int32_t>(last + dice_.pick<std::int64_t>({1, 2, -1, -2}));
        if (last < 0) last = static_cast<std::int32_t>(o.size() > 1 ? o[o.size() - 2] + 7 : 1);
        what = "[last] = " + std::to_string(last);
        break;
      }
      case 2: {  // an offset below the previous one
        const auto i = static_cast<std::size_t>(dice_.uniform(1, n - 1));
        o[i] = static_cast<std::int32_t>(o[i - 1] - dice_.uniform(1, 3));
        what = indexed("", static_cast<std::int64_t>(i)) + " below its predecessor";
        break;
      }
      default: {  // an offset above the next one (or the row count)
        const auto i = static_cast<std::size_t>(dice_.uniform(0, n - 2));
        o[i] = static_cast<std::int32_t>(o[i + 1] + dice_.uniform(1, 3));
        what = indexed("", static_cast<std::int64_t>(i)) + " above its successor";
        break;
      }
    }
    x->names = {name};
    x->what = name + what;
    return true;
  }

  // rel-pos on a packed batch, which has no common key grid.
  bool varlen_rel_pos(Expected* x) {
    if (!is_varlen(call_.entry)) return false;
    fmha::AttentionOptions* o = call_.options();
    const std::int64_t hk = std::max<std::int64_t>(call_.rows_k, 1);
    o->rel_h =
        place(arena_, call_.device, call_.dtype, {call_.batch, call_.heads, call_.rows_q, hk}, {});
    o->rel_w =
        place(arena_, call_.device, call_.dtype, {call_.batch, call_.heads, call_.rows_q, 1}, {});
    x->names = {"options.rel_h", "options.rel_w"};
    x->what = "rel_h / rel_w given to varlen attention";
    return true;
  }

  // Merge: as many lses as outs (and backward: douts, dlses), at least one part.
  bool part_count(Expected* x) {
    if (!is_merge(call_.entry)) return false;
    auto change = [&](std::vector<TensorView>& list, const char* name) {
      if (list.size() > 1 && dice_.chance(0.5))
        list.pop_back();
      else
        list.push_back(list.front());
      x->names = {name};
      x->what = std::string(name) + " count " + std::to_string(list.size());
    };
    std::visit(
        [&](auto& p) {
          if constexpr (requires { p.outs; }) {
            const std::int64_t pick = dice_.uniform(
                0, requires { p.douts; } ? 4 : 2);
            if (pick == 0) {
              p.outs.clear();
              p.lses.clear();
              x->names = {"outs"};
              x->what = "no parts";
            } else if (pick == 1) {
              change(p.lses, "lses");
              x->names.push_back("outs");
            } else if (pick == 2) {
              change(p.outs, "outs");
              x->names.push_back("lses");
            } else {
              if constexpr (requires { p.douts; })
                change(pick == 3 ? p.douts : p.dlses, pick == 3 ? "douts" : "dlses");
            }
          }
        },
        call_.params);
    return true;
  }

  Call& call_;
  Dice& dice_;
  Arena& arena_;
};

}  // namespace

bool corrupt(Kind kind, Call& call, Dice& dice, Arena& arena, Expected* x) {
  return Corruptor(call, dice, arena).apply(kind, x);
}

}  // namespace fmha_fuzz
