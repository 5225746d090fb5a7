#include "reference/gradient_sum.h"

#include <algorithm>

#include "reference/tensor_access.h"

namespace fmha::reference {
namespace {

// Memory elements the view really has: its size with broadcast (stride-0) dimensions counted once.
std::int64_t distinct_elements(const TensorView& view) {
  std::int64_t count = 1;
  for (int d = 0; d < view.rank; ++d) {
    const auto dim = static_cast<std::size_t>(d);
    count *= view.stride[dim] == 0 ? std::min<std::int64_t>(view.shape[dim], 1) : view.shape[dim];
  }
  return count;
}

// Sums indexed directly by memory offset: fast, for views whose elements are packed closely.
void write_dense(const TensorView& grad, const std::vector<const GradientPartial*>& partials,
                 std::int64_t span) {
  std::vector<double> sum(static_cast<std::size_t>(span), 0.0);
  for (const GradientPartial* partial : partials) {
    for (const auto& [offset, value] : partial->entries()) sum[static_cast<std::size_t>(offset)] += value;
  }
  for_each_element(grad, [&](std::int64_t offset) {
    store(grad, offset, sum[static_cast<std::size_t>(offset)]);
  });
}

// Sums of a sparse view (strides far larger than its elements, e.g. a batch stride past 2^31):
// memory follows the contributions, not the address span. A stable sort keeps, for every offset,
// the contributions in partial order, so the sums are the same as write_dense's, bit for bit.
void write_sparse(const TensorView& grad, const std::vector<const GradientPartial*>& partials) {
  std::vector<std::pair<std::int64_t, double>> entries;
  for (const GradientPartial* partial : partials)
    entries.insert(entries.end(), partial->entries().begin(), partial->entries().end());
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for_each_element(grad, [&](std::int64_t offset) {
    auto it = std::lower_bound(entries.begin(), entries.end(), offset,
                               [](const auto& e, std::int64_t o) { return e.first < o; });
    double sum = 0.0;
    for (; it != entries.end() && it->first == offset; ++it) sum += it->second;
    store(grad, offset, sum);
  });
}

}  // namespace

void write_gradient(const TensorView& grad, const std::vector<const GradientPartial*>& partials) {
  // An empty view has nothing to write; the tasks may still have recorded contributions for a
  // broadcast dimension of size 0, which address no element.
  if (!grad.defined() || grad.numel() == 0) return;
  const std::int64_t span = element_span(grad);
  // Dense sums cost 8 bytes per addressable offset; beyond a few times the real element count the
  // sparse path's memory (proportional to the contributions) is the smaller one.
  constexpr std::int64_t kDenseSlack = 4;
  if (span <= kDenseSlack * distinct_elements(grad) + 4096) {
    write_dense(grad, partials, span);
  } else {
    write_sparse(grad, partials);
  }
}

}  // namespace fmha::reference
