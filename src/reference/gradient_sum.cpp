#include "reference/gradient_sum.h"

#include "reference/tensor_access.h"

namespace fmha::reference {

void write_gradient(const TensorView& grad, const std::vector<const GradientPartial*>& partials) {
  if (!grad.defined()) return;
  // Sums are indexed by memory offset, so every logical element that aliases an offset lands in the
  // same slot; the span covers only the addresses this view can reach.
  std::vector<double> sum(static_cast<std::size_t>(element_span(grad)), 0.0);
  for (const GradientPartial* partial : partials) {
    for (const auto& [offset, value] : partial->entries())
      sum[static_cast<std::size_t>(offset)] += value;
  }
  for_each_element(grad, [&](std::int64_t offset) {
    store(grad, offset, sum[static_cast<std::size_t>(offset)]);
  });
}

}  // namespace fmha::reference
