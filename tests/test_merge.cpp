// Merging partial attentions (SPEC §12). The keys of one attention are split into disjoint sets
// (strided views of k / v / bias: no copies), each part is computed with its lse, the parts are
// merged, and the result must equal the whole attention, forward and backward (the backward runs
// merge backward, then each part's attention backward with the douts / dlses it produced).
// Merge backward alone is checked by finite differences in fp64.
#include <cmath>
#include <limits>

#include "test_case.h"

namespace fmha_test {
namespace {

// How the keys are split into parts: key ranges, or interleaved (key j in part j % parts; the seq
// dim of k / v then has a larger stride, which bias cannot follow: its last dim must stay stride 1).
enum class Split { kRanges, kInterleaved };

// The keys of part `p` along dim `dim` of `v`.
fmha::TensorView part_of(fmha::TensorView v, int dim, Split split, int p, int parts) {
  if (!v.defined()) return v;
  const auto d = static_cast<std::size_t>(dim);
  const std::int64_t n = v.shape[d];
  std::int64_t start = p, count = (n - p + parts - 1) / parts, step = parts;
  if (split == Split::kRanges) {
    start = n * p / parts;
    count = n * (p + 1) / parts - start;
    step = 1;
  }
  v.data = static_cast<char*>(v.data) + start * v.stride[d] * static_cast<std::int64_t>(fmha::element_size(v.dtype));
  v.shape[d] = count;
  v.stride[d] *= step;
  return v;
}

DType stat_dtype(DType d) { return d == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }

// Split the keys of `c` into `parts` disjoint sets; sinks and extra keys go to part 0 only.
void check_merge_matches_whole(const AttentionCase& c, Split split, int parts, std::uint64_t seed) {
  SCOPED_TRACE("merge of " + std::to_string(parts) +
               (split == Split::kRanges ? " key ranges: " : " interleaved key sets: ") +
               c.describe());
  CaseTensors t = make_tensors(c, seed);
  const naive::Problem problem = naive_problem(c, t);
  const naive::Forward ref = naive::forward(problem, naive::exact);
  // fp16 / bf16: SPEC §13 against the naive same-dtype computation of the whole attention.
  const naive::Round round = naive_rounding(c.dtype);
  const naive::Forward lowp_ref = naive::forward(problem, round);
  auto tol = [&](const std::vector<double>& r, const std::vector<double>& lr, DType storage) {
    return tolerance(c.dtype, r, lr, storage);
  };
  const DType stat = stat_dtype(c.dtype);

  std::vector<HostTensor> outs, lses, douts, dlses, dqs;
  std::vector<fmha::AttentionOptions> part_options;
  for (int p = 0; p < parts; ++p) {
    fmha::AttentionOptions o = c.options;
    o.bias = part_of(t.bias.view(), 3, split, p, parts);
    if (p == 0) {
      o.sinks = t.sinks.view();
      o.extra_k = t.extra_k.view();
      o.extra_v = t.extra_v.view();
    }
    part_options.push_back(o);
    outs.emplace_back(c.dtype, t.out.shape());
    lses.emplace_back(stat_dtype(c.dtype), t.lse.shape());
    outs.back().poison();
    lses.back().poison();
    const fmha::Status s = fmha::run(fmha::AttentionForwardParams{
        .q = t.q.view(), .k = part_of(t.k.view(), 1, split, p, parts), .v = part_of(t.v.view(), 1, split, p, parts),
        .out = outs.back().view(), .lse = lses.back().view(), .options = o});
    ASSERT_TRUE(s.ok()) << "part " << p << ": " << s.message();
  }
  std::vector<fmha::TensorView> out_views, lse_views;
  for (int p = 0; p < parts; ++p) {
    out_views.push_back(outs[static_cast<std::size_t>(p)].view());
    lse_views.push_back(lses[static_cast<std::size_t>(p)].view());
  }
  t.out.poison();
  t.lse.poison();
  const fmha::Status ms = fmha::run(fmha::MergeForwardParams{
      .outs = out_views, .lses = lse_views, .out = t.out.view(), .lse = t.lse.view()});
  ASSERT_TRUE(ms.ok()) << ms.message();
  EXPECT_TRUE(close("merged out", t.out.to_double(), ref.out, t.out.shape(),
                    tol(ref.out, lowp_ref.out, c.dtype)));
  const auto ref_lse = lse_to_library(c, ref.lse);
  EXPECT_TRUE(close("merged lse", t.lse.to_double(), ref_lse, t.lse.shape(),
                    tol(ref_lse, lse_to_library(c, lowp_ref.lse), stat)));
  if (!c.backward) return;

  // Backward through the merge, then through each part into strided views of the full gradients.
  std::vector<fmha::TensorView> dout_views, dlse_views;
  for (int p = 0; p < parts; ++p) {
    douts.emplace_back(c.dtype, t.out.shape());
    dlses.emplace_back(stat_dtype(c.dtype), t.lse.shape());
    douts.back().poison();
    dlses.back().poison();
  }
  for (int p = 0; p < parts; ++p) {
    dout_views.push_back(douts[static_cast<std::size_t>(p)].view());
    dlse_views.push_back(dlses[static_cast<std::size_t>(p)].view());
  }
  const fmha::Status mbs = fmha::run(fmha::MergeBackwardParams{
      .outs = out_views, .lses = lse_views, .out = t.out.view(), .lse = t.lse.view(), .dout = t.dout.view(),
      .dlse = t.dlse.view(), .douts = dout_views, .dlses = dlse_views});
  ASSERT_TRUE(mbs.ok()) << mbs.message();
  for (HostTensor* g : {&t.dk, &t.dv, &t.dbias, &t.dsinks, &t.dextra_k, &t.dextra_v})
    if (g->defined()) g->poison();
  std::vector<double> dq(static_cast<std::size_t>(t.q.numel()), 0.0);
  for (int p = 0; p < parts; ++p) {
    const auto pi = static_cast<std::size_t>(p);
    HostTensor part_dq(c.dtype, t.q.shape());
    part_dq.poison();
    fmha::AttentionGradients g;
    g.dq = part_dq.view();
    g.dk = part_of(t.dk.view(), 1, split, p, parts);
    g.dv = part_of(t.dv.view(), 1, split, p, parts);
    g.dbias = part_of(t.dbias.view(), 3, split, p, parts);
    if (p == 0) {
      g.dsinks = t.dsinks.view();
      g.dextra_k = t.dextra_k.view();
      g.dextra_v = t.dextra_v.view();
    }
    const fmha::Status s = fmha::run(fmha::AttentionBackwardParams{
        .q = t.q.view(), .k = part_of(t.k.view(), 1, split, p, parts), .v = part_of(t.v.view(), 1, split, p, parts),
        .out = outs[pi].view(), .lse = lses[pi].view(), .dout = douts[pi].view(), .dlse = dlses[pi].view(),
        .options = part_options[pi], .grads = g});
    ASSERT_TRUE(s.ok()) << "part " << p << " backward: " << s.message();
    const std::vector<double> part = part_dq.to_double();
    for (std::size_t i = 0; i < dq.size(); ++i) dq[i] += part[i];
  }
  const std::vector<double> dlse = t.dlse.defined() ? lse_from_library(c, t.dlse.to_double()) : std::vector<double>{};
  const naive::Gradients ref_g = naive::backward(problem, ref, t.dout.to_double(), dlse, naive::exact);
  const naive::Gradients lowp_g = naive::backward(problem, lowp_ref, t.dout.to_double(), dlse, round);
  EXPECT_TRUE(close("dq (sum over parts)", dq, ref_g.dq, t.dq.shape(),
                    tol(ref_g.dq, lowp_g.dq, c.dtype)));
  EXPECT_TRUE(close("dk", t.dk.to_double(), ref_g.dk, t.dk.shape(),
                    tol(ref_g.dk, lowp_g.dk, c.dtype)));
  EXPECT_TRUE(close("dv", t.dv.to_double(), ref_g.dv, t.dv.shape(),
                    tol(ref_g.dv, lowp_g.dv, c.dtype)));
  if (t.dbias.defined()) {
    EXPECT_TRUE(close("dbias", t.dbias.to_double(), ref_g.dbias, t.dbias.shape(),
                      tol(ref_g.dbias, lowp_g.dbias, c.dtype)));
  }
  if (t.dsinks.defined()) {
    EXPECT_TRUE(close("dsinks", t.dsinks.to_double(), ref_g.dsinks, t.dsinks.shape(),
                      tol(ref_g.dsinks, lowp_g.dsinks, stat)));
  }
  if (t.dextra_k.defined()) {
    EXPECT_TRUE(close("dextra_k", t.dextra_k.to_double(), ref_g.dextra_k, t.dextra_k.shape(),
                      tol(ref_g.dextra_k, lowp_g.dextra_k, c.dtype)));
    EXPECT_TRUE(close("dextra_v", t.dextra_v.to_double(), ref_g.dextra_v, t.dextra_v.shape(),
                      tol(ref_g.dextra_v, lowp_g.dextra_v, c.dtype)));
  }
}

AttentionCase merge_case(DType dtype) {
  AttentionCase c;
  c.dtype = dtype;
  c.batch = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.value_dim = 8;
  c.seqlen_q = 11;
  c.seqlen_k = 19;
  c.bias.given = true;
  c.sinks = true;
  c.extra = 2;
  c.dlse = true;
  c.options.softcap = 3.0f;
  return c;
}

TEST(Merge, TwoPartsMatchWhole) {
  check_merge_matches_whole(merge_case(DType::kFloat32), Split::kRanges, 2, 1);
  check_merge_matches_whole(merge_case(DType::kFloat64), Split::kRanges, 2, 2);
}

TEST(Merge, FourPartsMatchWhole) {
  check_merge_matches_whole(merge_case(DType::kFloat32), Split::kRanges, 4, 3);
  AttentionCase c = merge_case(DType::kFloat32);
  c.dlse = false;
  c.sinks = false;
  c.extra = 0;
  check_merge_matches_whole(c, Split::kRanges, 4, 4);
}

TEST(Merge, InterleavedKeySets) {
  AttentionCase c = merge_case(DType::kFloat32);
  c.bias.given = false;
  check_merge_matches_whole(c, Split::kInterleaved, 3, 5);
  c.dtype = DType::kFloat64;
  check_merge_matches_whole(c, Split::kInterleaved, 2, 6);
}

TEST(Merge, LowPrecision) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    check_merge_matches_whole(merge_case(dtype), Split::kRanges, 3, 8);
    AttentionCase c = merge_case(dtype);
    c.bias.given = false;
    check_merge_matches_whole(c, Split::kInterleaved, 2, 9);
  }
}

TEST(Merge, EmptyPartsContributeNothing) {
  AttentionCase c = merge_case(DType::kFloat32);
  c.seqlen_k = 3;  // 5 parts over 3 keys: two parts are empty (out 0, lse -inf)
  check_merge_matches_whole(c, Split::kRanges, 5, 7);
}

// Merge backward alone by finite differences: L = sum(out * W) + sum(lse * Wl).
TEST(Merge, BackwardFiniteDifferences) {
  const std::int64_t b = 2, lq = 3, h = 2, dv = 3;
  const int parts = 3;
  std::mt19937_64 rng(7);
  std::vector<HostTensor> outs, lses, douts, dlses;
  for (int p = 0; p < parts; ++p) {
    outs.emplace_back(DType::kFloat64, std::vector<std::int64_t>{b, lq, h, dv});
    lses.emplace_back(DType::kFloat64, std::vector<std::int64_t>{b, h, lq});
    outs.back().fill_uniform(rng, -1, 1);
    lses.back().fill_uniform(rng, -2, 2);
    douts.emplace_back(DType::kFloat64, std::vector<std::int64_t>{b, lq, h, dv});
    dlses.emplace_back(DType::kFloat64, std::vector<std::int64_t>{b, h, lq});
  }
  // A part that saw no key for some rows: lse -inf (and out 0) there.
  lses[1].set(0, -std::numeric_limits<double>::infinity());
  lses[1].set(4, -std::numeric_limits<double>::infinity());
  for (std::int64_t e = 0; e < dv; ++e) outs[1].set(e, 0.0);
  HostTensor out(DType::kFloat64, {b, lq, h, dv}), lse(DType::kFloat64, {b, h, lq});
  HostTensor w_out(DType::kFloat64, {b, lq, h, dv}), w_lse(DType::kFloat64, {b, h, lq});
  w_out.fill_uniform(rng, -1, 1);
  w_lse.fill_uniform(rng, -1, 1);

  auto views = [](std::vector<HostTensor>& ts) {
    std::vector<fmha::TensorView> v;
    for (auto& t : ts) v.push_back(t.view());
    return v;
  };
  auto loss = [&]() {
    const fmha::Status s = fmha::run(fmha::MergeForwardParams{.outs = views(outs), .lses = views(lses),
                                                              .out = out.view(), .lse = lse.view()});
    EXPECT_TRUE(s.ok()) << s.message();
    double l = 0;
    for (std::int64_t i = 0; i < out.numel(); ++i) l += out.at(i) * w_out.at(i);
    for (std::int64_t i = 0; i < lse.numel(); ++i) l += lse.at(i) * w_lse.at(i);
    return l;
  };
  loss();
  for (auto* list : {&douts, &dlses})
    for (auto& t : *list) t.poison();
  const fmha::Status s = fmha::run(fmha::MergeBackwardParams{
      .outs = views(outs), .lses = views(lses), .out = out.view(), .lse = lse.view(), .dout = w_out.view(),
      .dlse = w_lse.view(), .douts = views(douts), .dlses = views(dlses)});
  ASSERT_TRUE(s.ok()) << s.message();

  const double step = 1e-6;
  for (int p = 0; p < parts; ++p) {
    const auto pi = static_cast<std::size_t>(p);
    for (auto [input, grad, name] :
         {std::tuple{&outs[pi], &douts[pi], "douts"}, std::tuple{&lses[pi], &dlses[pi], "dlses"}}) {
      std::vector<double> numeric, analytic;
      for (std::int64_t i = 0; i < input->numel(); ++i) {
        const double x = input->at(i);
        if (std::isinf(x)) {  // a -inf part has weight 0: no gradient reaches it
          EXPECT_EQ(grad->at(i), 0.0) << name << "[" << p << "] at " << i;
          continue;
        }
        input->set(i, x + step);
        const double up = loss();
        input->set(i, x - step);
        const double down = loss();
        input->set(i, x);
        numeric.push_back((up - down) / (2 * step));
        analytic.push_back(grad->at(i));
      }
      EXPECT_TRUE(close(std::string(name) + "[" + std::to_string(p) + "] vs finite differences", analytic, numeric,
                        {static_cast<std::int64_t>(numeric.size())}, 1e-6));
    }
  }
}

TEST(Merge, AllPartsEmpty) {
  const std::int64_t b = 1, lq = 2, h = 2, dv = 4;
  std::vector<HostTensor> outs, lses, douts, dlses;
  for (int p = 0; p < 2; ++p) {
    outs.emplace_back(DType::kFloat32, std::vector<std::int64_t>{b, lq, h, dv});
    lses.emplace_back(DType::kFloat32, std::vector<std::int64_t>{b, h, lq});
    for (std::int64_t i = 0; i < lses.back().numel(); ++i) lses.back().set(i, -std::numeric_limits<double>::infinity());
    douts.emplace_back(DType::kFloat32, std::vector<std::int64_t>{b, lq, h, dv});
    dlses.emplace_back(DType::kFloat32, std::vector<std::int64_t>{b, h, lq});
    douts.back().poison();
    dlses.back().poison();
  }
  HostTensor out(DType::kFloat32, {b, lq, h, dv}), lse(DType::kFloat32, {b, h, lq});
  HostTensor dout(DType::kFloat32, {b, lq, h, dv}), dlse(DType::kFloat32, {b, h, lq});
  std::mt19937_64 rng(9);
  dout.fill_uniform(rng, -1, 1);
  dlse.fill_uniform(rng, -1, 1);
  out.poison();
  lse.poison();
  const std::vector<fmha::TensorView> ov{outs[0].view(), outs[1].view()}, lv{lses[0].view(), lses[1].view()};
  ASSERT_TRUE(fmha::run(fmha::MergeForwardParams{.outs = ov, .lses = lv, .out = out.view(), .lse = lse.view()}).ok());
  for (double x : out.to_double()) EXPECT_EQ(x, 0.0);
  for (double x : lse.to_double()) EXPECT_TRUE(std::isinf(x) && x < 0) << x;
  ASSERT_TRUE(fmha::run(fmha::MergeBackwardParams{.outs = ov, .lses = lv, .out = out.view(), .lse = lse.view(),
                                                  .dout = dout.view(), .dlse = dlse.view(),
                                                  .douts = {douts[0].view(), douts[1].view()},
                                                  .dlses = {dlses[0].view(), dlses[1].view()}})
                  .ok());
  for (const auto* list : {&douts, &dlses})
    for (const auto& t : *list)
      for (double x : t.to_double()) EXPECT_EQ(x, 0.0);
}

}  // namespace
}  // namespace fmha_test
