// Deterministic gradient reduction. A gradient view may map several logical elements onto one
// memory element (stride-0 broadcast of bias, rel-pos, sinks shared by sequences, or any broadcast
// input); that element must hold the sum of all of them. Tasks therefore never write gradients
// directly: each records its contributions, and write_gradient adds them up in task order (so the
// result does not depend on thread scheduling) and stores every memory element of the view exactly
// once.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "fmha/tensor.h"

namespace fmha::reference {

// The contributions of one task to one gradient view, keyed by element offset in that view.
class GradientPartial {
 public:
  void add(std::int64_t offset, double value) { entries_.emplace_back(offset, value); }
  const std::vector<std::pair<std::int64_t, double>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::int64_t, double>> entries_;
};

// Overwrites every element of `grad` with the sum of the contributions to it (0 when none), adding
// partials in the order given. Does nothing when `grad` is not given.
void write_gradient(const TensorView& grad, const std::vector<const GradientPartial*>& partials);

}  // namespace fmha::reference
