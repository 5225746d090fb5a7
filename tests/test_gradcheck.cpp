// Finite-difference gradient checks (float64, central differences, tiny shapes) of every
// differentiable input of dense, varlen and neighborhood attention, through a loss that uses both
// out and lse: L = sum(out * W) + sum(lse * Wl) (Wl = 0 on rows whose lse is -inf).
#include <cmath>

#include "test_case.h"

namespace fmha_test {
namespace {

constexpr double kStep = 1e-5;
// Central differences in fp64 with kStep: truncation ~kStep^2, cancellation ~1e-16 / kStep.
constexpr double kTolerance = 1e-6;

double loss(const AttentionCase& c, CaseTensors& t, const std::vector<double>& w_out,
            const std::vector<double>& w_lse) {
  const fmha::Status s = run_forward(c, t);
  EXPECT_TRUE(s.ok()) << s.message();
  double l = 0;
  const std::vector<double> out = t.out.to_double();
  for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * w_out[i];
  if (!w_lse.empty()) {
    const std::vector<double> lse = t.lse.to_double();
    for (std::size_t i = 0; i < lse.size(); ++i)
      if (std::isfinite(lse[i])) l += lse[i] * w_lse[i];
  }
  return l;
}

// The logical index of the storage element that logical index `i` of `t` reads: broadcast
// coordinates pinned to 0.
std::int64_t canonical(const HostTensor& t, std::int64_t i) {
  auto coords = unravel(i, t.shape());
  std::int64_t index = 0;
  for (int d = 0; d < t.rank(); ++d) index = index * t.shape()[d] + (t.broadcast_dim(d) ? 0 : coords[d]);
  return index;
}

// Perturbing one stored element of `input` moves every logical element aliasing it, so the finite
// difference sees the sum of the gradient over those aliases. A gradient that broadcasts where the
// input does (dbias) already holds that sum, once.
std::vector<double> gradient_per_stored_element(const HostTensor& input, const HostTensor& grad,
                                                const std::vector<std::int64_t>& stored) {
  std::vector<double> per_index(static_cast<std::size_t>(input.numel()), 0.0);
  for (std::int64_t i = 0; i < input.numel(); ++i) {
    const auto coords = unravel(i, input.shape());
    bool counted_already = false;
    for (int d = 0; d < input.rank(); ++d)
      counted_already = counted_already || (input.broadcast_dim(d) && grad.broadcast_dim(d) && coords[d] != 0);
    if (!counted_already) per_index[static_cast<std::size_t>(canonical(input, i))] += grad.at(i);
  }
  std::vector<double> result;
  for (std::int64_t i : stored) result.push_back(per_index[static_cast<std::size_t>(i)]);
  return result;
}

void gradcheck(AttentionCase c, std::uint64_t seed) {
  c.dtype = DType::kFloat64;
  SCOPED_TRACE("gradcheck: " + c.describe());
  CaseTensors t = make_tensors(c, seed);
  const fmha::Status fs = run_forward(c, t);
  ASSERT_TRUE(fs.ok()) << fs.message();
  if (t.dlse.defined()) {  // no gradient can flow into a -inf lse: give those rows weight 0
    for (std::int64_t i = 0; i < t.lse.numel(); ++i)
      if (std::isinf(t.lse.at(i))) t.dlse.set(i, 0.0);
  }
  const fmha::Status bs = run_backward(c, t);
  ASSERT_TRUE(bs.ok()) << bs.message();
  const std::vector<double> w_out = t.dout.to_double();
  const std::vector<double> w_lse = t.dlse.defined() ? t.dlse.to_double() : std::vector<double>{};

  struct Pair {
    const char* name;
    HostTensor* input;
    const HostTensor* grad;
  };
  const Pair pairs[] = {{"q", &t.q, &t.dq},           {"k", &t.k, &t.dk},
                        {"v", &t.v, &t.dv},           {"bias", &t.bias, &t.dbias},
                        {"rel_h", &t.rel_h, &t.drel_h}, {"rel_w", &t.rel_w, &t.drel_w},
                        {"sinks", &t.sinks, &t.dsinks}, {"extra_k", &t.extra_k, &t.dextra_k},
                        {"extra_v", &t.extra_v, &t.dextra_v}};
  for (const Pair& pair : pairs) {
    if (!pair.input->defined()) continue;
    std::vector<std::int64_t> stored;
    for (std::int64_t i = 0; i < pair.input->numel(); ++i)
      if (canonical(*pair.input, i) == i) stored.push_back(i);
    std::vector<double> numeric;
    for (std::int64_t i : stored) {
      const double x = pair.input->at(i);
      pair.input->set(i, x + kStep);
      const double up = loss(c, t, w_out, w_lse);
      pair.input->set(i, x - kStep);
      const double down = loss(c, t, w_out, w_lse);
      pair.input->set(i, x);
      numeric.push_back((up - down) / (2 * kStep));
    }
    const std::vector<double> analytic = gradient_per_stored_element(*pair.input, *pair.grad, stored);
    EXPECT_TRUE(close(std::string("d") + pair.name + " vs finite differences", analytic, numeric,
                      {static_cast<std::int64_t>(numeric.size())}, kTolerance));
  }
}

AttentionCase tiny_dense() {
  AttentionCase c;
  c.batch = 2;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 3;
  c.value_dim = 2;
  c.seqlen_q = 3;
  c.seqlen_k = 4;
  return c;
}

TEST(Gradcheck, DenseQkv) {
  AttentionCase c = tiny_dense();
  gradcheck(c, 1);
  c.dlse = true;
  c.options.causal = true;
  c.q_storage = Storage::kHeadsOuter;
  c.kv_storage = Storage::kPadded;
  gradcheck(c, 2);
  c.q_storage = Storage::kBroadcastBatch;  // stride-0 inputs, full gradients
  c.kv_storage = Storage::kBroadcastHeads;
  c.kv_heads = 2;
  gradcheck(c, 3);
}

TEST(Gradcheck, DenseAllInputsWithDlse) {
  AttentionCase c = tiny_dense();
  c.seqlen_q = 5;  // bottom-right causal with Lq > Lk: rows 0 and 1 fully masked
  c.options.causal = true;
  c.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
  c.options.window_left = 2;
  c.options.softcap = 2.0f;
  c.options.scale = 0.8f;
  c.bias = {.given = true, .broadcast = {true, false, true, false}, .zero_stride = true};
  c.rel_hk = 2;
  c.sinks = true;
  c.extra = 2;
  c.dlse = true;
  gradcheck(c, 3);
  c.sinks = false;  // without sinks the masked rows have lse -inf
  c.bias = {.given = true, .broadcast = {false, true, false, false}, .zero_stride = true};
  c.rel_broadcast = {true, false, true};
  gradcheck(c, 4);
  c.rel_zero_stride = true;
  gradcheck(c, 5);
}

TEST(Gradcheck, DenseBiasBroadcasts) {
  for (bool zero_stride : {false, true}) {
    AttentionCase c = tiny_dense();
    c.dlse = true;  // without it, a bias broadcast over keys has an exactly zero gradient
    c.bias = {.given = true, .broadcast = {true, true, false, false}, .zero_stride = zero_stride};
    gradcheck(c, 5);
    c.bias = {.given = true, .broadcast = {false, false, true, true}, .zero_stride = zero_stride};
    gradcheck(c, 6);
  }
}

TEST(Gradcheck, Varlen) {
  AttentionCase c;
  c.kind = Kind::kVarlen;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 3;
  c.value_dim = 2;
  c.seqlens_q = {2, 0, 3};
  c.seqlens_k = {3, 2, 2};
  c.options.causal = true;
  c.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
  c.bias.given = true;
  c.sinks = true;
  c.extra = 1;
  c.dlse = true;
  gradcheck(c, 7);
}

TEST(Gradcheck, Neighborhood) {
  AttentionCase c;
  c.kind = Kind::kNeighborhood;
  c.batch = 1;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 3;
  c.value_dim = 2;
  c.grid = {3, 4, 1};
  c.neighborhood = {.num_dims = 2, .kernel_size = {2, 3, 1}, .dilation = {1, 1, 1}, .causal = {true, false, false}};
  c.extra = 1;
  c.sinks = true;
  c.dlse = true;
  gradcheck(c, 8);
  c.bias = {.given = true, .broadcast = {false, true, false, false}, .zero_stride = true};
  c.rel_hk = 3;
  c.options.softcap = 1.5f;
  c.neighborhood.dilation = {1, 2, 1};
  c.neighborhood.kernel_size = {3, 2, 1};
  gradcheck(c, 9);
}

}  // namespace
}  // namespace fmha_test
