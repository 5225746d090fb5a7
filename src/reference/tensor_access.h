// Typed element access for the CPU reference: every TensorView element is read and written as a
// double, whatever its storage dtype, so the reference computes everything in double precision.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/numeric.h"
#include "fmha/tensor.h"

namespace fmha::reference {

// Rounds x to float with round-to-odd: an inexact result gets its last mantissa bit set. A second
// rounding of that float to fp16/bf16 (round-to-nearest-even) is then the correctly rounded value
// of x; rounding x to float with round-to-nearest first could land exactly on a 16-bit tie and
// break it the wrong way. Needs float to carry at least two more bits than the target, which it
// does.
inline float round_to_odd_float(double x) {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) == x || std::isnan(x) || std::isinf(f)) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);  // truncate
  return numeric::bits_float(numeric::float_bits(f) | 1u);
}

// Reads element `offset` (in elements, relative to view.data) as a double.
inline double load(const TensorView& view, std::int64_t offset) {
  switch (view.dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(view.data)[offset];
    case DType::kFloat64:
      return static_cast<const double*>(view.data)[offset];
    case DType::kFloat16:
      return numeric::fp16_to_float(static_cast<const std::uint16_t*>(view.data)[offset]);
    case DType::kBFloat16:
      return numeric::bf16_to_float(static_cast<const std::uint16_t*>(view.data)[offset]);
    case DType::kInt32:
      return static_cast<const std::int32_t*>(view.data)[offset];
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// Writes `value`, correctly rounded to the view's dtype, at element `offset`.
inline void store(const TensorView& view, std::int64_t offset, double value) {
  switch (view.dtype) {
    case DType::kFloat32:
      static_cast<float*>(view.data)[offset] = static_cast<float>(value);
      return;
    case DType::kFloat64:
      static_cast<double*>(view.data)[offset] = value;
      return;
    case DType::kFloat16:
      static_cast<std::uint16_t*>(view.data)[offset] =
          numeric::float_to_fp16(round_to_odd_float(value));
      return;
    case DType::kBFloat16:
      static_cast<std::uint16_t*>(view.data)[offset] =
          numeric::float_to_bf16(round_to_odd_float(value));
      return;
    case DType::kInt32:
      static_cast<std::int32_t*>(view.data)[offset] = static_cast<std::int32_t>(value);
      return;
  }
}

// One past the largest element offset the view addresses (strides are non-negative), 0 if empty.
inline std::int64_t element_span(const TensorView& view) {
  std::int64_t last = 0;
  for (int d = 0; d < view.rank; ++d) {
    const auto dim = static_cast<std::size_t>(d);
    if (view.shape[dim] == 0) return 0;
    last += (view.shape[dim] - 1) * view.stride[dim];
  }
  return view.rank > 0 ? last + 1 : 0;
}

// Calls fn(offset) for every distinct memory element of the view, in row-major order of its logical
// indices; a dimension of stride 0 is visited at index 0 only, so broadcast elements come once.
template <typename Fn>
void for_each_element(const TensorView& view, Fn&& fn) {
  if (element_span(view) == 0) return;
  std::int64_t extent[kMaxRank];
  std::int64_t index[kMaxRank] = {};
  for (int d = 0; d < view.rank; ++d) {
    const auto dim = static_cast<std::size_t>(d);
    extent[d] = view.stride[dim] == 0 ? 1 : view.shape[dim];
  }
  std::int64_t offset = 0;
  while (true) {
    fn(offset);
    int d = view.rank - 1;
    for (; d >= 0; --d) {  // odometer step: bump the last dimension, carry into earlier ones
      const std::int64_t stride = view.stride[static_cast<std::size_t>(d)];
      if (++index[d] < extent[d]) {
        offset += stride;
        break;
      }
      offset -= (extent[d] - 1) * stride;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace fmha::reference
