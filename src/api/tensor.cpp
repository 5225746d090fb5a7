#include "fmha/tensor.h"

#include <sstream>

namespace fmha {

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
  }
  return "unknown dtype";
}

std::size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kFloat64: return 8;
    case DType::kInt32: return 4;
  }
  return 0;
}

// "cpu" (its index only when not 0: two CPU devices differ by it), "cuda:<index>", and a value
// outside DeviceType spelled as one (validation refuses it by that name).
std::string to_string(Device device) {
  std::ostringstream s;
  switch (device.type) {
    case DeviceType::kCPU:
      s << "cpu";
      if (device.index != 0) s << ':' << device.index;
      break;
    case DeviceType::kCUDA: s << "cuda:" << device.index; break;
    default: s << "device type " << static_cast<int>(device.type) << ':' << device.index; break;
  }
  return s.str();
}

namespace {

// The dimensions a view holds: a rank outside 0..kMaxRank (refused by validation) reads none past
// the arrays.
int held_rank(int rank) {
  return rank < 0 ? 0 : (rank > kMaxRank ? kMaxRank : rank);
}

}  // namespace

std::int64_t TensorView::numel() const {
  if (rank <= 0) return 0;
  std::int64_t n = 1;
  for (int d = 0; d < held_rank(rank); ++d) n *= shape[static_cast<std::size_t>(d)];
  return n;
}

std::string TensorView::shape_string() const {
  std::ostringstream s;
  s << '[';
  for (int d = 0; d < held_rank(rank); ++d) {
    s << (d ? ", " : "") << shape[static_cast<std::size_t>(d)];
  }
  if (rank > kMaxRank) s << ", ...";
  s << ']';
  return s.str();
}

TensorView TensorView::strided(void* data, DType dtype, int rank, const std::int64_t* shape,
                               const std::int64_t* stride, Device device) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = rank < 0 ? 0 : (rank > kMaxRank ? kMaxRank : rank);
  for (int d = 0; d < t.rank; ++d) {
    t.shape[static_cast<std::size_t>(d)] = shape[d];
    t.stride[static_cast<std::size_t>(d)] = stride[d];
  }
  return t;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               std::initializer_list<std::int64_t> stride, Device device) {
  const int rank = static_cast<int>(shape.size() < stride.size() ? shape.size() : stride.size());
  return strided(data, dtype, rank, shape.begin(), stride.begin(), device);
}

TensorView TensorView::contiguous(void* data, DType dtype, int rank, const std::int64_t* shape,
                                  Device device) {
  std::array<std::int64_t, kMaxRank> stride{};
  std::int64_t running = 1;
  for (int d = rank - 1; d >= 0; --d) {
    stride[static_cast<std::size_t>(d)] = running;
    running *= shape[d];
  }
  return strided(data, dtype, rank, shape, stride.data(), device);
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                                  Device device) {
  return contiguous(data, dtype, static_cast<int>(shape.size()), shape.begin(), device);
}

}  // namespace fmha
