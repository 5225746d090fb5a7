// Valid draws of the fuzzing harness (fuzz_draws.h): small attention problems over every option,
// dtype, layout and stride pattern against the naive float64 oracle (check_case), and merges of 1
// to 4 parts against a float64 merge, within SPEC §13.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_draws.h"

namespace fmha_fuzz {

using fmha::DType;
using fmha_test::AttentionCase;
using fmha_test::HostTensor;
using fmha_test::Kind;
using fmha_test::Layout;
using fmha_test::Storage;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr std::int64_t kMaxTokens = 32;  // sequence length, or grid size
constexpr std::int64_t kMaxHeadDim = 40;
constexpr std::int64_t kMaxHeads = 6;

std::int64_t draw_length(Dice& dice, double zero) {
  if (dice.chance(zero)) return 0;
  return dice.chance(0.5) ? dice.uniform(1, 8) : dice.uniform(1, kMaxTokens);
}

std::int64_t draw_head_dim(Dice& dice) {
  return dice.chance(0.5) ? dice.pick<std::int64_t>({1, 2, 3, 4, 7, 8, 15, 16, 24, 31, 32, 33, 40})
                          : dice.uniform(1, kMaxHeadDim);
}

}  // namespace

AttentionCase random_attention_case(std::uint64_t seed, const ValidLimits& limits) {
  Dice dice(seed);
  dice.uniform(0, 9);  // the draw's kind (fuzz_valid): attention or merge
  AttentionCase c;
  const std::int64_t kind = dice.uniform(0, 2);
  c.kind = kind == 0 ? Kind::kDense : kind == 1 ? Kind::kVarlen : Kind::kNeighborhood;
  c.dtype = limits.float64
                ? dice.pick({DType::kFloat32, DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                             DType::kFloat64})
                : dice.pick({DType::kFloat32, DType::kFloat32, DType::kFloat16, DType::kBFloat16});
  c.kv_heads = dice.uniform(1, 3);
  c.heads = c.kv_heads * dice.uniform(1, kMaxHeads / c.kv_heads);
  c.head_dim = draw_head_dim(dice);
  c.value_dim = dice.chance(0.5) ? c.head_dim : draw_head_dim(dice);
  c.batch = dice.chance(0.03) ? 0 : dice.uniform(1, 3);

  switch (c.kind) {
    case Kind::kDense:
      c.seqlen_q = draw_length(dice, 0.08);
      c.seqlen_k = draw_length(dice, 0.08);
      break;
    case Kind::kVarlen: {
      const std::int64_t sequences = dice.uniform(1, 4);
      for (std::int64_t b = 0; b < sequences; ++b) {
        c.seqlens_q.push_back(static_cast<std::int32_t>(draw_length(dice, 0.15)));
        c.seqlens_k.push_back(static_cast<std::int32_t>(draw_length(dice, 0.15)));
      }
      break;
    }
    case Kind::kNeighborhood: {
      auto& n = c.neighborhood;
      n.num_dims = static_cast<int>(dice.uniform(1, 3));
      std::int64_t room = kMaxTokens;  // the grid holds at most kMaxTokens tokens
      for (int r = 0; r < n.num_dims; ++r) {
        const std::int64_t cap = n.num_dims == 1 ? kMaxTokens : n.num_dims == 2 ? 8 : 4;
        c.grid[r] = dice.uniform(1, std::max<std::int64_t>(1, std::min(cap, room)));
        room /= c.grid[r];
        n.kernel_size[r] = dice.uniform(1, c.grid[r]);
        n.dilation[r] = dice.uniform(1, c.grid[r] / n.kernel_size[r]);
        n.causal[r] = dice.chance(0.3);
      }
      for (int r = n.num_dims; r < 3; ++r) {  // ignored past num_dims, whatever they hold
        if (dice.chance(0.5)) n.kernel_size[r] = dice.pick<std::int64_t>({0, -1, 99});
        if (dice.chance(0.5)) n.dilation[r] = dice.pick<std::int64_t>({0, -3, 7});
        if (dice.chance(0.5)) n.causal[r] = true;
      }
      break;
    }
  }

  auto& o = c.options;
  if (dice.chance(0.3)) {
    o.scale = dice.chance(0.1)   ? 0.0f
              : dice.chance(0.1) ? -static_cast<float>(dice.real(0.05, 1))
                                 : static_cast<float>(dice.real(0.05, 1.5));
  }
  if (dice.chance(0.3)) o.softcap = static_cast<float>(dice.real(0.25, 10));
  if (c.kind != Kind::kNeighborhood) {
    o.causal = dice.chance(0.35);
    o.causal_alignment =
        dice.chance(0.5) ? fmha::CausalAlignment::kTopLeft : fmha::CausalAlignment::kBottomRight;
    if (dice.chance(0.3)) {
      // Bounds past every sequence mean "unbounded" as -1 does.
      auto bound = [&] { return dice.chance(0.1) ? std::int64_t{1} << 40 : dice.uniform(-1, 10); };
      o.window_left = bound();
      o.window_right = bound();
    }
  }
  if (dice.chance(0.35)) {
    c.bias.given = true;
    for (bool& b : c.bias.broadcast) b = dice.chance(0.3);
    c.bias.zero_stride = dice.chance(0.5);
  }
  const std::int64_t lk = c.rows_per_batch_k();
  draw_key_extras(dice, lk, &c);
  // A bias broadcast over keys gets the sum of dS over a whole row, and so do drel_h / drel_w
  // wherever the masks (a neighborhood kernel, a window) keep a query's visible keys inside one
  // row or column of the key grid: exactly zero unless lse has a gradient, and a relative check
  // would compare rounding noise.
  if ((c.bias.given && c.bias.broadcast[3]) || c.rel_hk > 0) c.dlse = true;
  const bool varlen = c.kind == Kind::kVarlen;
  auto storage = [&]() {
    const Storage s = dice.pick({Storage::kContiguous, Storage::kContiguous, Storage::kPadded,
                                 Storage::kPadded, Storage::kHeadsOuter, Storage::kHeadsOuter,
                                 Storage::kBroadcastBatch, Storage::kBroadcastHeads});
    // varlen has no batch dim: stride 0 on its token dim would make every token identical
    return varlen && s == Storage::kBroadcastBatch ? Storage::kBroadcastHeads : s;
  };
  c.q_storage = storage();
  c.kv_storage = storage();
  o.deterministic = dice.chance(0.2);
  o.allow_tf32 = dice.chance(0.15);
  c.backward_impl = dice.pick(
      {fmha::BackwardImpl::kAuto, fmha::BackwardImpl::kFused, fmha::BackwardImpl::kSplit});
  c.lse_output = dice.chance(0.9);
  c.backward = c.lse_output && dice.chance(0.85);
  c.input_grads = dice.chance(0.85);
  return c;
}

namespace {

// ---- Merges ------------------------------------------------------------------------------------

struct MergeDraw {
  DType dtype = DType::kFloat32, stat = DType::kFloat32;
  std::int64_t batch = 1, rows = 1, heads = 1, value_dim = 1;
  int parts = 1;
  bool backward = true, dlse = false;
  std::vector<Layout> part_layouts;  // of outs[i] (inputs: may broadcast)
  Layout out_layout;                 // of out, dout and douts (written: never broadcast)

  std::string describe() const {
    std::ostringstream s;
    s << "merge " << fmha::to_string(dtype) << " lse:" << fmha::to_string(stat) << " B=" << batch
      << " Lq=" << rows << " H=" << heads << " Dv=" << value_dim << " parts=" << parts
      << (backward ? "" : " forward-only") << (dlse ? " dlse" : "");
    for (const Layout& l : part_layouts)
      s << (l.pad                  ? " padded"
            : !l.order.empty()     ? " heads-outer"
            : !l.broadcast.empty() ? " broadcast"
                                   : " contiguous");
    s << " out:"
      << (out_layout.pad              ? "padded"
          : !out_layout.order.empty() ? "heads-outer"
                                      : "contiguous");
    return s.str();
  }
};

MergeDraw random_merge(std::uint64_t seed, const ValidLimits& limits) {
  Dice dice(seed);
  dice.uniform(0, 9);  // the draw's kind
  MergeDraw m;
  m.dtype = limits.float64
                ? dice.pick({DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64})
                : dice.pick({DType::kFloat32, DType::kFloat16, DType::kBFloat16});
  m.stat = m.dtype == DType::kFloat64 && dice.chance(0.5) ? DType::kFloat64 : DType::kFloat32;
  m.batch = dice.chance(0.05) ? 0 : dice.uniform(1, 3);
  m.rows = draw_length(dice, 0.05);
  m.heads = dice.uniform(1, kMaxHeads);
  m.value_dim = draw_head_dim(dice);
  m.parts = static_cast<int>(dice.uniform(1, 4));
  m.backward = dice.chance(0.8);
  m.dlse = dice.chance(0.5);
  auto layout = [&](bool input) {
    Layout l;
    switch (dice.uniform(0, input ? 4 : 2)) {
      case 1:
        l.pad = dice.uniform(1, 3);
        break;
      case 2:
        l.order = {0, 2, 1, 3};
        break;  // stored [B, H, Lq, Dv]
      case 3:
        l.broadcast = {true, false, false, false};
        break;
      case 4:
        l.broadcast = {false, false, true, false};
        break;
      default:
        break;
    }
    return l;
  };
  for (int p = 0; p < m.parts; ++p) m.part_layouts.push_back(layout(true));
  m.out_layout = layout(false);
  return m;
}

// Float64 merge of SPEC §12 and, for fp16 / bf16, the naive same-dtype one (every product and
// partial sum rounded to the dtype) that SPEC §13's bound is measured against.
struct MergeRef {
  std::vector<double> out, lse;  // out [B, Lq, H, Dv], lse [B, H, Lq]
  std::vector<std::vector<double>> douts, dlses;
};

MergeRef merge_reference(const MergeDraw& m, const std::vector<std::vector<double>>& outs,
                         const std::vector<std::vector<double>>& lses,
                         const std::vector<double>& dout, const std::vector<double>& dlse,
                         DType round_to) {
  auto round = [&](double x) { return fmha_test::round_to(round_to, x); };
  MergeRef r;
  const std::int64_t dv = m.value_dim;
  const auto parts = static_cast<std::size_t>(m.parts);
  r.out.assign(outs[0].size(), 0.0);
  r.lse.assign(lses[0].size(), 0.0);
  r.douts.assign(parts, std::vector<double>(outs[0].size(), 0.0));
  r.dlses.assign(parts, std::vector<double>(lses[0].size(), 0.0));
  for (std::int64_t b = 0; b < m.batch; ++b)
    for (std::int64_t i = 0; i < m.rows; ++i)
      for (std::int64_t h = 0; h < m.heads; ++h) {
        const auto l = static_cast<std::size_t>((b * m.heads + h) * m.rows + i);
        const auto o = static_cast<std::size_t>(((b * m.rows + i) * m.heads + h) * dv);
        double top = kNegInf;
        for (std::size_t p = 0; p < parts; ++p) top = std::max(top, lses[p][l]);
        if (top == kNegInf) {  // no part saw a key: out 0, lse -inf, gradients 0
          r.lse[l] = kNegInf;
          continue;
        }
        double sum = 0;
        for (std::size_t p = 0; p < parts; ++p) sum += std::exp(lses[p][l] - top);
        const double lse = top + std::log(sum);
        r.lse[l] = lse;
        std::vector<double> w(parts);
        for (std::size_t p = 0; p < parts; ++p) w[p] = std::exp(lses[p][l] - lse);
        for (std::int64_t e = 0; e < dv; ++e) {
          double acc = 0;
          for (std::size_t p = 0; p < parts; ++p)
            acc = round(acc + round(w[p] * outs[p][o + static_cast<std::size_t>(e)]));
          r.out[o + static_cast<std::size_t>(e)] = acc;
        }
        if (dout.empty()) continue;
        // dlse_p = w_p (dout . out_p - dout . out + dlse), dout_p = w_p dout
        double dot_out = 0;
        for (std::int64_t e = 0; e < dv; ++e)
          dot_out = round(dot_out + round(dout[o + static_cast<std::size_t>(e)] *
                                          r.out[o + static_cast<std::size_t>(e)]));
        const double g = dlse.empty() ? 0.0 : dlse[l];
        for (std::size_t p = 0; p < parts; ++p) {
          if (w[p] == 0) continue;
          double dot = 0;
          for (std::int64_t e = 0; e < dv; ++e) {
            const auto at = o + static_cast<std::size_t>(e);
            dot = round(dot + round(dout[at] * outs[p][at]));
            r.douts[p][at] = round(w[p] * dout[at]);
          }
          r.dlses[p][l] = w[p] * (dot - dot_out + g);
        }
      }
  return r;
}

// One merge draw, forward and (usually) backward, on the CPU or on `device`.
void check_merge(const MergeDraw& m, std::uint64_t seed, fmha_test::CaseDevice* device,
                 std::string* not_supported) {
  SCOPED_TRACE("case: " + m.describe() + " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<std::int64_t> out_shape{m.batch, m.rows, m.heads, m.value_dim},
      lse_shape{m.batch, m.heads, m.rows};
  std::vector<HostTensor> outs, lses, douts, dlses;
  std::uniform_real_distribution<double> unit(0, 1);
  const std::int64_t lse_count = m.batch * m.heads * m.rows;
  std::vector<bool> empty_row(static_cast<std::size_t>(lse_count));
  for (auto&& e : empty_row) e = unit(rng) < 0.08;  // no part saw a key
  for (int p = 0; p < m.parts; ++p) {
    outs.emplace_back(m.dtype, out_shape, m.part_layouts[static_cast<std::size_t>(p)]);
    outs.back().fill_uniform(rng, -1, 1);
    // A broadcast part repeats rows, so its lse must be the same along them for the draw to stay
    // one problem: keep lse plain and random, it is a separate tensor.
    lses.emplace_back(m.stat, lse_shape);
    lses.back().fill_uniform(rng, -4, 4);
    for (std::int64_t i = 0; i < lse_count; ++i)
      if (empty_row[static_cast<std::size_t>(i)] || unit(rng) < 0.15) lses.back().set(i, kNegInf);
  }
  HostTensor out(m.dtype, out_shape, m.out_layout), lse(m.stat, lse_shape);
  std::vector<fmha::TensorView> out_views, lse_views;
  std::vector<std::pair<HostTensor*, fmha::TensorView>> copies;
  auto view = [&](HostTensor& h) {
    if (device == nullptr || !h.defined()) return h.view();
    const fmha::TensorView v = device->upload(h);
    copies.push_back({&h, v});
    return v;
  };
  // After a run: sync, copy `outputs` back, free the copies.
  auto finish = [&](const fmha::Status& s, const std::vector<HostTensor*>& outputs) {
    if (device == nullptr) return s;
    const fmha::Status synced = device->synchronize();
    for (const auto& [host, v] : copies)
      if (std::find(outputs.begin(), outputs.end(), host) != outputs.end())
        device->download(*host, v);
    device->release();
    copies.clear();
    return s.ok() ? synced : s;
  };
  auto refused = [&](const fmha::Status& s, const std::vector<HostTensor*>& outputs) {
    if (not_supported == nullptr || s.code() != fmha::StatusCode::kNotSupported) return false;
    EXPECT_EQ(s.message().rfind("fmha: ", 0), 0u) << "unclear refusal: " << s.message();
    for (const HostTensor* o : outputs)
      EXPECT_TRUE(o->poisoned()) << "a refused merge wrote an output";
    *not_supported = s.message();
    return true;
  };
  out.poison();
  lse.poison();
  for (auto& t : outs) out_views.push_back(view(t));
  for (auto& t : lses) lse_views.push_back(view(t));
  const fmha::Status fs =
      finish(fmha::run(
                 fmha::MergeForwardParams{
                     .outs = out_views, .lses = lse_views, .out = view(out), .lse = view(lse)},
                 device ? device->stream() : nullptr),
             {&out, &lse});
  if (refused(fs, {&out, &lse})) return;
  ASSERT_TRUE(fs.ok()) << "merge forward refused: " << fs.message();

  std::vector<std::vector<double>> out_values, lse_values;
  for (const auto& t : outs) out_values.push_back(t.to_double());
  for (const auto& t : lses) lse_values.push_back(t.to_double());
  HostTensor dout, dlse;
  std::vector<double> dout_values, dlse_values;
  if (m.backward) {
    dout = HostTensor(m.dtype, out_shape, m.part_layouts[0]);
    dout.fill_uniform(rng, -1, 1);
    dout_values = dout.to_double();
    if (m.dlse) {
      dlse = HostTensor(m.stat, lse_shape);
      dlse.fill_uniform(rng, -1, 1);
      dlse_values = dlse.to_double();
    }
  }
  const MergeRef ref =
      merge_reference(m, out_values, lse_values, dout_values, dlse_values, DType::kFloat64);
  const bool lowp = m.dtype == DType::kFloat16 || m.dtype == DType::kBFloat16;
  const MergeRef naive =
      lowp ? merge_reference(m, out_values, lse_values, dout_values, dlse_values, m.dtype) : ref;
  auto tol = [&](const std::vector<double>& r, const std::vector<double>& lr, DType storage) {
    return fmha_test::tolerance(m.dtype, r, lr, storage);
  };
  // An fp64 merge with fp32 statistics stores lse and dlses in fp32: they get fp32's bound.
  auto stat_tol = [&](const std::vector<double>& r, const std::vector<double>& lr) {
    return m.dtype == DType::kFloat64 && m.stat == DType::kFloat32
               ? fmha_test::tolerance(DType::kFloat32)
               : tol(r, lr, m.stat);
  };
  EXPECT_TRUE(fmha_test::close("out", out.to_double(), ref.out, out_shape,
                               tol(ref.out, naive.out, m.dtype)));
  EXPECT_EQ(out.padding_report(), "") << "out: an element outside the view (padding) was written";
  EXPECT_TRUE(
      fmha_test::close("lse", lse.to_double(), ref.lse, lse_shape, stat_tol(ref.lse, ref.lse)));
  if (!m.backward) return;

  for (int p = 0; p < m.parts; ++p) {
    douts.emplace_back(m.dtype, out_shape, m.out_layout);
    dlses.emplace_back(m.stat, lse_shape);
    douts.back().poison();
    dlses.back().poison();
  }
  out_views.clear();
  lse_views.clear();
  std::vector<fmha::TensorView> dout_views, dlse_views;
  for (auto& t : outs) out_views.push_back(view(t));
  for (auto& t : lses) lse_views.push_back(view(t));
  for (auto& t : douts) dout_views.push_back(view(t));
  for (auto& t : dlses) dlse_views.push_back(view(t));
  std::vector<HostTensor*> gradients;
  for (auto& t : douts) gradients.push_back(&t);
  for (auto& t : dlses) gradients.push_back(&t);
  const fmha::Status bs = finish(fmha::run(fmha::MergeBackwardParams{.outs = out_views,
                                                                     .lses = lse_views,
                                                                     .out = view(out),
                                                                     .lse = view(lse),
                                                                     .dout = view(dout),
                                                                     .dlse = view(dlse),
                                                                     .douts = dout_views,
                                                                     .dlses = dlse_views},
                                           device ? device->stream() : nullptr),
                                 gradients);
  if (refused(bs, gradients)) return;
  ASSERT_TRUE(bs.ok()) << "merge backward refused: " << bs.message();
  for (int p = 0; p < m.parts; ++p) {
    const auto i = static_cast<std::size_t>(p);
    const std::string n = std::string("[") + std::to_string(p) + ']';
    EXPECT_TRUE(fmha_test::close("douts" + n, douts[i].to_double(), ref.douts[i], out_shape,
                                 tol(ref.douts[i], naive.douts[i], m.dtype)));
    EXPECT_EQ(douts[i].padding_report(), "")
        << "douts" << n << ": an element outside the view was written";
    EXPECT_TRUE(fmha_test::close("dlses" + n, dlses[i].to_double(), ref.dlses[i], lse_shape,
                                 stat_tol(ref.dlses[i], naive.dlses[i])));
  }
}

// What the valid draws covered: counts by a few features, printed at the end of a run.
class Coverage {
 public:
  void add(const std::string& feature) { ++counts_[feature]; }
  void print(std::ostream& s) const {
    for (const auto& [feature, n] : counts_) s << ' ' << feature << '=' << n;
  }

 private:
  std::map<std::string, std::int64_t> counts_;
};

void cover(Coverage& c, const AttentionCase& a) {
  const char* kinds[] = {"dense", "varlen", "na"};
  const std::string kind = kinds[static_cast<int>(a.kind)];
  c.add(kind + (a.backward ? "-backward" : "-forward"));
  if (a.kind == Kind::kNeighborhood) c.add("na-" + std::to_string(a.neighborhood.num_dims) + "d");
  c.add(fmha::to_string(a.dtype));
  const auto& o = a.options;
  if (o.causal) c.add("causal");
  if (o.window_left >= 0 || o.window_right >= 0) c.add("window");
  if (o.softcap > 0) c.add("softcap");
  if (o.scale) c.add("scale");
  if (a.bias.given) c.add(a.bias.zero_stride ? "bias-stride0" : "bias-size1");
  if (a.rel_hk > 0) c.add("rel-pos");
  if (a.sinks) c.add("sinks");
  if (a.extra > 0) c.add("extra-keys");
  if (a.dlse && a.backward) c.add("dlse");
  if (o.deterministic) c.add("deterministic");
  const char* storages[] = {"contiguous", "padded", "heads-outer", "broadcast-batch",
                            "broadcast-heads"};
  c.add(std::string("q-") + storages[static_cast<int>(a.q_storage)]);
  c.add(std::string("kv-") + storages[static_cast<int>(a.kv_storage)]);
}

}  // namespace

void fuzz_valid(fmha_test::CaseDevice* device, const ValidLimits& limits, const FuzzRun& run) {
  CrashNote crash_note;
  Coverage coverage;
  std::map<std::string, std::int64_t> refusals;  // not supported on this device: message -> count
  for (std::int64_t i = 0; i < run.count; ++i) {
    const std::uint64_t seed = run.seed + static_cast<std::uint64_t>(i);
    const std::string replay = run.replay_prefix + std::to_string(seed) + " " + run.replay_suffix;
    crash_note.set("valid draw seed " + std::to_string(seed) + "; replay: " + replay);
    std::string refused;
    const bool merge = Dice(seed).uniform(0, 9) == 0;
    if (merge) {
      const MergeDraw m = random_merge(seed, limits);
      if (run.verbose) std::cout << "valid draw seed " << seed << ": " << m.describe() << std::endl;
      coverage.add(m.backward ? "merge-backward" : "merge-forward");
      check_merge(m, seed, device, device ? &refused : nullptr);
    } else {
      const AttentionCase c = random_attention_case(seed, limits);
      if (run.verbose) std::cout << "valid draw seed " << seed << ": " << c.describe() << std::endl;
      cover(coverage, c);
      fmha_test::check_case(c, seed, device, device ? &refused : nullptr);
    }
    if (!refused.empty()) ++refusals[refused];
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "valid draw seed " << seed << " failed; replay: " << replay;
      break;  // one failing draw at a time keeps the report readable
    }
  }
  std::cout << "[ fuzz ] " << run.count << " valid draws from seed " << run.seed << ":";
  coverage.print(std::cout);
  std::cout << std::endl;
  for (const auto& [message, n] : refusals)
    std::cout << "[ fuzz ] refused as not supported " << n << "x: " << message << '\n';
}

}  // namespace fmha_fuzz
