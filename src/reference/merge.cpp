// Merging partial attentions over disjoint key sets (SPEC §12), forward and backward.
// Parts: out [B, Lq, H, Dv], lse [B, H, Lq].
#include <cmath>
#include <limits>
#include <vector>

#include "reference/parallel.h"
#include "reference/reference.h"
#include "reference/tensor_access.h"

namespace fmha::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::int64_t out_offset(const TensorView& t, std::int64_t b, std::int64_t i, std::int64_t h,
                        std::int64_t d) {
  return b * t.stride[0] + i * t.stride[1] + h * t.stride[2] + d * t.stride[3];
}

std::int64_t lse_offset(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t i) {
  return b * t.stride[0] + h * t.stride[1] + i * t.stride[2];
}

// The merged lse of row (b, h, i) and each part's weight w_n = exp(lse_n - lse). -inf parts weigh
// 0; when every part is -inf the row is empty: lse -inf and every weight 0, so out and all
// gradients come out 0 instead of NaN.
double merge_weights(const std::vector<TensorView>& lses, std::int64_t b, std::int64_t h,
                     std::int64_t i, std::vector<double>* weights) {
  const std::size_t parts = lses.size();
  weights->assign(parts, 0.0);
  double row_max = kNegInf;
  for (std::size_t n = 0; n < parts; ++n) {
    (*weights)[n] = load(lses[n], lse_offset(lses[n], b, h, i));  // lse_n, for now
    row_max = std::max(row_max, (*weights)[n]);
  }
  if (row_max == kNegInf) {
    weights->assign(parts, 0.0);
    return kNegInf;
  }
  double sum = 0.0;
  for (const double lse_n : *weights) sum += std::exp(lse_n - row_max);
  const double lse = row_max + std::log(sum);
  for (double& w : *weights) w = std::exp(w - lse);
  return lse;
}

// Calls row(b, h, i) for every row of an out-shaped [B, Lq, H, Dv] tensor, one task per (b, h).
template <typename Row>
void for_each_row(const TensorView& out, const Row& row) {
  const std::int64_t batch = out.shape[0], len_q = out.shape[1], heads = out.shape[2];
  parallel_for(batch * heads, [&](std::int64_t task) {
    for (std::int64_t i = 0; i < len_q; ++i) row(task / heads, task % heads, i);
  });
}

}  // namespace

void run(const MergeForwardParams& p) {
  const std::int64_t value_dim = p.out.shape[3];
  for_each_row(p.out, [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    std::vector<double> weights;
    const double lse = merge_weights(p.lses, b, h, i, &weights);
    // out = sum_n exp(lse_n - lse) * out_n
    for (std::int64_t d = 0; d < value_dim; ++d) {
      double sum = 0.0;
      for (std::size_t n = 0; n < weights.size(); ++n) {
        if (weights[n] != 0.0)
          sum += weights[n] * load(p.outs[n], out_offset(p.outs[n], b, i, h, d));
      }
      store(p.out, out_offset(p.out, b, i, h, d), sum);
    }
    if (p.lse.defined()) store(p.lse, lse_offset(p.lse, b, h, i), lse);
  });
}

// With w_n = exp(lse_n - lse) and out = sum_n w_n out_n:
//   dout_n = w_n * dout
//   dlse_n = w_n * (dout . out_n - dout . out + dlse)      (d w_m / d lse_n = w_m (delta_mn - w_n))
// The merged out is recomputed in double from the parts rather than read from p.out, so the
// gradients are exact functions of the inputs (as in the attention backward).
void run(const MergeBackwardParams& p) {
  const std::int64_t value_dim = p.dout.shape[3];
  const std::size_t parts = p.outs.size();
  for_each_row(p.dout, [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    std::vector<double> weights, dout(static_cast<std::size_t>(value_dim));
    merge_weights(p.lses, b, h, i, &weights);
    for (std::int64_t d = 0; d < value_dim; ++d)
      dout[static_cast<std::size_t>(d)] = load(p.dout, out_offset(p.dout, b, i, h, d));
    // dout . out_n per part, and dout . out = sum_n w_n (dout . out_n).
    std::vector<double> dout_dot_part(parts, 0.0);
    double dout_dot_out = 0.0;
    for (std::size_t n = 0; n < parts; ++n) {
      if (weights[n] == 0.0) continue;
      for (std::int64_t d = 0; d < value_dim; ++d)
        dout_dot_part[n] +=
            dout[static_cast<std::size_t>(d)] * load(p.outs[n], out_offset(p.outs[n], b, i, h, d));
      dout_dot_out += weights[n] * dout_dot_part[n];
    }
    const double dlse = p.dlse.defined() ? load(p.dlse, lse_offset(p.dlse, b, h, i)) : 0.0;
    for (std::size_t n = 0; n < parts; ++n) {
      if (n < p.douts.size() && p.douts[n].defined()) {
        for (std::int64_t d = 0; d < value_dim; ++d)
          store(p.douts[n], out_offset(p.douts[n], b, i, h, d),
                weights[n] * dout[static_cast<std::size_t>(d)]);
      }
      if (n < p.dlses.size() && p.dlses[n].defined()) {
        const double grad =
            weights[n] == 0.0 ? 0.0 : weights[n] * (dout_dot_part[n] - dout_dot_out + dlse);
        store(p.dlses[n], lse_offset(p.dlses[n], b, h, i), grad);
      }
    }
  });
}

}  // namespace fmha::reference
