#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "common/numeric.h"

namespace fmha_test {

std::int64_t product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  return n;
}

std::vector<std::int64_t> unravel(std::int64_t index, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> coords(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    coords[d] = shape[d] ? index % shape[d] : 0;
    index = shape[d] ? index / shape[d] : 0;
  }
  return coords;
}

std::string index_string(std::int64_t index, const std::vector<std::int64_t>& shape) {
  std::ostringstream s;
  s << index << " [";
  const auto coords = unravel(index, shape);
  for (std::size_t d = 0; d < coords.size(); ++d) s << (d ? ", " : "") << coords[d];
  s << ']';
  return s.str();
}

std::string dtype_name(DType dtype) { return fmha::to_string(dtype); }

double round_to(DType dtype, double x) {
  namespace nm = fmha::numeric;
  switch (dtype) {
    case DType::kFloat64: return x;
    case DType::kFloat32: return static_cast<float>(x);
    case DType::kFloat16: return nm::fp16_to_float(nm::float_to_fp16(static_cast<float>(x)));
    case DType::kBFloat16: return nm::bf16_to_float(nm::float_to_bf16(static_cast<float>(x)));
    case DType::kInt32: return static_cast<double>(static_cast<std::int32_t>(x));
  }
  return x;
}

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> shape, const Layout& layout)
    : dtype_(dtype), shape_(std::move(shape)), stride_(shape_.size(), 0) {
  const int rank = static_cast<int>(shape_.size());
  std::vector<int> order = layout.order;
  if (order.empty())
    for (int d = 0; d < rank; ++d) order.push_back(d);
  if (static_cast<int>(order.size()) != rank || order.back() != rank - 1)
    throw std::invalid_argument("HostTensor: the layout order must end with the last dim");
  auto is_broadcast = [&](int d) {
    return static_cast<std::size_t>(d) < layout.broadcast.size() && layout.broadcast[d];
  };
  // Walk from the innermost dim outwards; broadcast dims take no room.
  std::int64_t running = 1;
  for (int pos = rank - 1; pos >= 0; --pos) {
    const int d = order[static_cast<std::size_t>(pos)];
    if (is_broadcast(d)) continue;
    stride_[d] = running;
    running *= std::max<std::int64_t>(shape_[d], 1);
    if (pos == rank - 1) running += layout.pad;
  }
  std::int64_t elements = 1;
  for (int d = 0; d < rank; ++d)
    if (shape_[d] > 0) elements += (shape_[d] - 1) * stride_[d];
  bytes_.assign(static_cast<std::size_t>(elements) * fmha::element_size(dtype_), 0);
}

std::int64_t HostTensor::numel() const { return defined() ? product(shape_) : 0; }

fmha::TensorView HostTensor::view() {
  if (!defined()) return {};
  return fmha::TensorView::strided(bytes_.data(), dtype_, rank(), shape_.data(), stride_.data());
}

bool HostTensor::broadcast_dim(int dim) const { return shape_[dim] == 1 || stride_[dim] == 0; }

std::int64_t HostTensor::offset_of(std::int64_t index) const {
  std::int64_t offset = 0;
  for (std::size_t d = shape_.size(); d-- > 0;) {
    offset += (index % shape_[d]) * stride_[d];
    index /= shape_[d];
  }
  return offset;
}

double HostTensor::at(std::int64_t index) const {
  const unsigned char* p = bytes_.data() + offset_of(index) * fmha::element_size(dtype_);
  namespace nm = fmha::numeric;
  switch (dtype_) {
    case DType::kFloat64: { double x; std::memcpy(&x, p, 8); return x; }
    case DType::kFloat32: { float x; std::memcpy(&x, p, 4); return x; }
    case DType::kInt32: { std::int32_t x; std::memcpy(&x, p, 4); return x; }
    case DType::kFloat16: { std::uint16_t x; std::memcpy(&x, p, 2); return nm::fp16_to_float(x); }
    case DType::kBFloat16: { std::uint16_t x; std::memcpy(&x, p, 2); return nm::bf16_to_float(x); }
  }
  return 0;
}

void HostTensor::set(std::int64_t index, double value) {
  unsigned char* p = bytes_.data() + offset_of(index) * fmha::element_size(dtype_);
  namespace nm = fmha::numeric;
  switch (dtype_) {
    case DType::kFloat64: std::memcpy(p, &value, 8); break;
    case DType::kFloat32: { const float x = static_cast<float>(value); std::memcpy(p, &x, 4); break; }
    case DType::kInt32: {
      const auto x = static_cast<std::int32_t>(value);
      std::memcpy(p, &x, 4);
      break;
    }
    case DType::kFloat16: {
      const std::uint16_t x = nm::float_to_fp16(static_cast<float>(value));
      std::memcpy(p, &x, 2);
      break;
    }
    case DType::kBFloat16: {
      const std::uint16_t x = nm::float_to_bf16(static_cast<float>(value));
      std::memcpy(p, &x, 2);
      break;
    }
  }
}

std::vector<double> HostTensor::to_double() const {
  std::vector<double> values(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) values[i] = at(i);
  return values;
}

void HostTensor::from_double(const std::vector<double>& values) {
  for (std::int64_t i = 0; i < numel(); ++i) set(i, values[static_cast<std::size_t>(i)]);
}

void HostTensor::fill_uniform(std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  for (std::int64_t i = 0; i < numel(); ++i) set(i, dist(rng));
}

namespace {

// The bytes of one poisoned element: a quiet NaN of the dtype (int32: an implausible count).
std::vector<unsigned char> poison_pattern(DType dtype) {
  std::vector<unsigned char> bytes(fmha::element_size(dtype));
  switch (dtype) {
    case DType::kFloat64: {
      const double x = std::numeric_limits<double>::quiet_NaN();
      std::memcpy(bytes.data(), &x, 8);
      break;
    }
    case DType::kFloat32: {
      const float x = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(bytes.data(), &x, 4);
      break;
    }
    case DType::kInt32: { const std::int32_t x = -12345; std::memcpy(bytes.data(), &x, 4); break; }
    case DType::kFloat16: { const std::uint16_t x = 0x7e00u; std::memcpy(bytes.data(), &x, 2); break; }
    case DType::kBFloat16: { const std::uint16_t x = 0x7fc0u; std::memcpy(bytes.data(), &x, 2); break; }
  }
  return bytes;
}

}  // namespace

void HostTensor::poison() {
  const std::vector<unsigned char> pattern = poison_pattern(dtype_);
  for (std::size_t at = 0; at + pattern.size() <= bytes_.size(); at += pattern.size())
    std::memcpy(bytes_.data() + at, pattern.data(), pattern.size());
}

bool HostTensor::padding_untouched() const { return padding_report().empty(); }

std::string HostTensor::padding_report() const {
  const std::vector<unsigned char> pattern = poison_pattern(dtype_);
  std::vector<bool> in_view(bytes_.size() / pattern.size(), false);
  for (std::int64_t i = 0; i < numel(); ++i) in_view[static_cast<std::size_t>(offset_of(i))] = true;
  for (std::size_t e = 0; e < in_view.size(); ++e) {
    const unsigned char* element = bytes_.data() + e * pattern.size();
    if (in_view[e] || std::memcmp(element, pattern.data(), pattern.size()) == 0) continue;
    std::ostringstream s;
    s << "storage element " << e << " of " << in_view.size()
      << " written outside the view; shape [";
    for (std::size_t d = 0; d < shape_.size(); ++d) s << (d ? ", " : "") << shape_[d];
    s << "], strides [";
    for (std::size_t d = 0; d < stride_.size(); ++d) s << (d ? ", " : "") << stride_[d];
    s << "]";
    return s.str();
  }
  return "";
}

bool HostTensor::poisoned() const {
  const std::vector<unsigned char> pattern = poison_pattern(dtype_);
  for (std::size_t at = 0; at + pattern.size() <= bytes_.size(); at += pattern.size())
    if (std::memcmp(bytes_.data() + at, pattern.data(), pattern.size()) != 0) return false;
  return true;
}

ErrorStats compare(const std::vector<double>& got, const std::vector<double>& ref, double tol) {
  ErrorStats st;
  if (got.size() != ref.size()) {
    st.problem = "size " + std::to_string(got.size()) + " vs reference " + std::to_string(ref.size());
    return st;
  }
  double diff2 = 0, ref2 = 0, sum_abs = 0;
  std::int64_t counted = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    if (std::isinf(r) && r < 0) {
      if (!(std::isinf(g) && g < 0) && st.problem.empty()) {
        st.problem = "expected -inf, got " + std::to_string(g);
        st.first_bad = static_cast<std::int64_t>(i);
      }
      continue;
    }
    if (!std::isfinite(g) || !std::isfinite(r)) {
      if (st.problem.empty()) {
        st.problem = "non-finite value " + std::to_string(g) + " (reference " + std::to_string(r) + ")";
        st.first_bad = static_cast<std::int64_t>(i);
      }
      continue;
    }
    const double e = std::fabs(g - r);
    diff2 += e * e;
    ref2 += r * r;
    sum_abs += e;
    ++counted;
    if (e > st.max_abs) {
      st.max_abs = e;
      st.worst = static_cast<std::int64_t>(i);
    }
  }
  st.mean_abs = counted ? sum_abs / static_cast<double>(counted) : 0;
  st.rel_error = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  if (st.first_bad < 0 && st.rel_error > tol) {
    // The first element whose error alone exceeds the tolerance on the rms scale of the reference.
    const double rms = counted ? std::sqrt(ref2 / static_cast<double>(counted)) : 0;
    const double limit = tol * (rms > 0 ? rms : 1.0);
    for (std::size_t i = 0; i < got.size(); ++i)
      if (std::isfinite(ref[i]) && std::fabs(got[i] - ref[i]) > limit) {
        st.first_bad = static_cast<std::int64_t>(i);
        break;
      }
  }
  return st;
}

::testing::AssertionResult close(const std::string& name, const std::vector<double>& got,
                                 const std::vector<double>& ref,
                                 const std::vector<std::int64_t>& shape, double tol) {
  const ErrorStats st = compare(got, ref, tol);
  if (st.problem.empty() && st.rel_error <= tol) return ::testing::AssertionSuccess();
  std::ostringstream m;
  m << name << ": ";
  if (!st.problem.empty()) m << st.problem << "; ";
  m << "relative error " << st.rel_error << " > tolerance " << tol << " (max abs " << st.max_abs
    << ", mean abs " << st.mean_abs << ")";
  if (st.first_bad >= 0) {
    const auto i = static_cast<std::size_t>(st.first_bad);
    m << "; first bad at " << index_string(st.first_bad, shape) << ": got " << got[i] << ", expected "
      << ref[i];
  }
  if (st.worst >= 0) {
    const auto i = static_cast<std::size_t>(st.worst);
    m << "; worst at " << index_string(st.worst, shape) << ": got " << got[i] << ", expected " << ref[i];
  }
  return ::testing::AssertionFailure() << m.str();
}

double tolerance(DType dtype, const std::vector<double>& ref, const std::vector<double>& lowp_ref,
                 DType storage) {
  switch (dtype) {
    case DType::kFloat64: return 1e-12;
    case DType::kFloat32: return 1e-5;
    default: break;
  }
  std::vector<double> stored(ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) stored[i] = round_to(storage, ref[i]);
  return 2 * compare(lowp_ref, ref, 0).rel_error + compare(stored, ref, 0).rel_error + 1e-4;
}

}  // namespace fmha_test
