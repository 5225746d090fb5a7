#include "api/validate_tensor.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "api/validate_message.h"

namespace fmha::detail {
namespace {

std::size_t at(int dim) {
  return static_cast<std::size_t>(dim);
}

std::string strides_string(const TensorView& t) {
  std::ostringstream s;
  s << '[';
  for (int d = 0; d < t.rank; ++d) s << (d ? ", " : "") << t.stride[at(d)];
  s << ']';
  return s.str();
}

std::string names_string(const Shape& shape) {
  std::ostringstream s;
  s << '[';
  for (std::size_t d = 0; d < shape.size(); ++d) s << (d ? ", " : "") << shape[d].name;
  s << ']';
  return s.str();
}

std::string sizes_string(const Shape& shape) {
  std::ostringstream s;
  s << '[';
  for (std::size_t d = 0; d < shape.size(); ++d) s << (d ? ", " : "") << shape[d].size;
  s << ']';
  return s.str();
}

bool is_attention_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat64;
}

enum class DTypeRule : std::uint8_t { kData, kStat, kIndex };

Status expect_dtype(const Anchor& anchor, const TensorView& t, std::string_view name,
                    DTypeRule rule) {
  switch (rule) {
    case DTypeRule::kData:
      if (t.dtype == anchor.dtype) return Status::ok_status();
      return invalid(name, " has dtype ", to_string(t.dtype), " but ", anchor.name, " has ",
                     to_string(anchor.dtype), "; ", name, " must have ", anchor.name, "'s dtype");
    case DTypeRule::kStat: {
      const bool fp64_allowed = anchor.dtype == DType::kFloat64;
      if (t.dtype == DType::kFloat32 || (fp64_allowed && t.dtype == DType::kFloat64)) {
        return Status::ok_status();
      }
      return invalid(name, " has dtype ", to_string(t.dtype), "; expected float32",
                     fp64_allowed ? " or float64 (" : "", fp64_allowed ? anchor.name : "",
                     fp64_allowed ? " is float64)" : "");
    }
    case DTypeRule::kIndex:
      if (t.dtype == DType::kInt32) return Status::ok_status();
      return invalid(name, " has dtype ", to_string(t.dtype), "; expected int32");
  }
  return invalid(name, " has an unknown dtype rule");
}

Status expect_device(const Anchor& anchor, const TensorView& t, std::string_view name) {
  if (t.device == anchor.device) return Status::ok_status();
  return invalid(name, " is on ", to_string(t.device), " but ", anchor.name, " is on ",
                 to_string(anchor.device), "; every tensor must be on ", anchor.name, "'s device");
}

// With `size_one_broadcasts`, a dimension of size 1 also matches (bias and rel-pos broadcast it).
Status expect_shape(const TensorView& t, std::string_view name, const Shape& shape,
                    bool size_one_broadcasts) {
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (t.shape[d] == shape[d].size || (size_one_broadcasts && t.shape[d] == 1)) continue;
    return invalid(name, " has shape ", t.shape_string(), "; expected ", names_string(shape), " = ",
                   sizes_string(shape), " (dimension ", d, ", ", shape[d].name, ", is ", t.shape[d],
                   " but must be ", shape[d].size,
                   size_one_broadcasts ? ", or 1 to broadcast)" : ")");
  }
  return Status::ok_status();
}

Status expect_nonnegative_strides(const TensorView& t, std::string_view name) {
  for (int d = 0; d < t.rank; ++d) {
    if (t.stride[at(d)] >= 0) continue;
    return invalid(name, " has stride ", t.stride[at(d)], " on dimension ", d, " (strides ",
                   strides_string(t), "); strides must be >= 0");
  }
  return Status::ok_status();
}

// A last dimension of size > 1 must be contiguous; broadcast inputs may also repeat one element.
Status expect_last_stride(const TensorView& t, std::string_view name, bool may_broadcast) {
  const std::int64_t size = t.size(-1), stride = t.stride_of(-1);
  if (size <= 1 || stride == 1 || (may_broadcast && stride == 0)) return Status::ok_status();
  return invalid(name, " has stride ", stride, " on its last dimension (size ", size,
                 "); the last dimension must be contiguous (stride 1",
                 may_broadcast ? ", or 0 to broadcast)" : ")");
}

// The largest element offset must fit in int64: backends index with signed 64-bit offsets.
// Like the checks below, run only on tensors with elements.
Status expect_offsets_fit(const TensorView& t, std::string_view name) {
  std::int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) {
    std::int64_t span = 0;
    if (!checked_mul(t.shape[at(d)] - 1, t.stride[at(d)], &span) ||
        __builtin_add_overflow(last, span, &last)) {
      return invalid(name, " with shape ", t.shape_string(), " and strides ", strides_string(t),
                     " reaches past 2^63 elements; offsets must fit in a signed 64-bit integer");
    }
  }
  return Status::ok_status();
}

// No two elements of a written tensor may share an address, or parallel writes would race. The
// test orders the dimensions by stride and requires each stride to step past everything the
// smaller ones span. That is sufficient, not necessary: it refuses only interleavings no framework
// allocates, and accepts every permuted, padded or sliced layout. Dimensions flagged in `skip`
// (broadcast gradients) are left out.
Status expect_no_overlap(const TensorView& t, std::string_view name,
                         const std::array<bool, kMaxRank>& skip) {
  std::array<int, kMaxRank> dims{};
  int count = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[at(d)] <= 1 || skip[at(d)]) continue;
    if (t.stride[at(d)] == 0) {
      return invalid(name, " has stride 0 on dimension ", d, " (size ", t.shape[at(d)],
                     "); an output cannot broadcast: its elements would share memory");
    }
    // Insertion by stride: at most kMaxRank dimensions.
    int i = count++;
    for (; i > 0 && t.stride[at(dims[at(i - 1)])] > t.stride[at(d)]; --i) {
      dims[at(i)] = dims[at(i - 1)];
    }
    dims[at(i)] = d;
  }
  std::int64_t spanned = 0;  // largest offset reached by the dimensions visited so far
  for (int i = 0; i < count; ++i) {
    const int d = dims[at(i)];
    if (t.stride[at(d)] <= spanned) {
      return invalid(name, " has shape ", t.shape_string(), " and strides ", strides_string(t),
                     ", under which different elements share memory; an output needs a "
                     "distinct address for every element");
    }
    spanned += (t.shape[at(d)] - 1) * t.stride[at(d)];  // bounded by expect_offsets_fit
  }
  return Status::ok_status();
}

Status expect_data_pointer(const TensorView& t, std::string_view name) {
  if (t.data == nullptr) {
    return invalid(name, " has ", t.numel(), " elements but a null data pointer");
  }
  const std::size_t alignment = element_size(t.dtype);
  if (reinterpret_cast<std::uintptr_t>(t.data) % alignment != 0) {
    return invalid(name, " has data pointer ", t.data, ", which is not aligned to its ",
                   to_string(t.dtype), " elements (", alignment, " bytes)");
  }
  return Status::ok_status();
}

Status expect_tensor(const Anchor& anchor, const TensorView& t, std::string_view name,
                     const Shape& shape, DTypeRule dtype, Access access, bool size_one_broadcasts) {
  // The layout's names go into a message only: a valid call does not build them (an
  // ostringstream a tensor was most of a valid call's validation time).
  const int rank = static_cast<int>(shape.size());
  FMHA_RETURN_IF_ERROR(
      expect_rank(t, name, rank, t.rank == rank ? std::string() : names_string(shape)));
  FMHA_RETURN_IF_ERROR(expect_dtype(anchor, t, name, dtype));
  FMHA_RETURN_IF_ERROR(expect_device(anchor, t, name));
  FMHA_RETURN_IF_ERROR(expect_shape(t, name, shape, size_one_broadcasts));
  FMHA_RETURN_IF_ERROR(expect_nonnegative_strides(t, name));
  // Without elements there is nothing to read or write: any layout and pointer will do.
  if (t.numel() == 0) return Status::ok_status();
  FMHA_RETURN_IF_ERROR(expect_last_stride(t, name, access == Access::kBroadcastInput));
  FMHA_RETURN_IF_ERROR(expect_offsets_fit(t, name));
  if (access == Access::kOutput) FMHA_RETURN_IF_ERROR(expect_no_overlap(t, name, {}));
  return expect_data_pointer(t, name);
}

}  // namespace

Shape shape_of(const TensorView& t, const Shape& names) {
  Shape shape = names;
  for (std::size_t d = 0; d < shape.size(); ++d) shape[d].size = t.shape[d];
  return shape;
}

bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t* product) {
  return !__builtin_mul_overflow(a, b, product);
}

Status expect_valid_rank(const TensorView& t, std::string_view name) {
  if (t.rank >= 0 && t.rank <= kMaxRank) return Status::ok_status();
  return invalid(name, " has rank ", t.rank, "; expected 1..", kMaxRank,
                 " dimensions, or rank 0 for a tensor that is not given");
}

Status expect_valid_ranks(std::initializer_list<NamedView> views) {
  for (const NamedView& v : views) FMHA_RETURN_IF_ERROR(expect_valid_rank(*v.view, v.name));
  return Status::ok_status();
}

Status expect_given(const TensorView& t, std::string_view name, std::string_view purpose) {
  if (t.defined()) return Status::ok_status();
  return invalid(name, " is required but not given (rank 0); ", purpose);
}

Status expect_rank(const TensorView& t, std::string_view name, int rank, std::string_view layout) {
  FMHA_RETURN_IF_ERROR(expect_valid_rank(t, name));
  if (!t.defined()) return invalid(name, " is required but not given (rank 0); expected ", layout);
  if (t.rank != rank) {
    return invalid(name, " has rank ", t.rank, " (shape ", t.shape_string(), "); expected rank ",
                   rank, ", ", layout);
  }
  std::int64_t numel = 1;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[at(d)] < 0) {
      return invalid(name, " has size ", t.shape[at(d)], " on dimension ", d, " (shape ",
                     t.shape_string(), "); sizes must be >= 0");
    }
    if (!checked_mul(numel, t.shape[at(d)], &numel)) {
      return invalid(name, " has shape ", t.shape_string(),
                     ", more than 2^63 elements; the element count must fit in int64");
    }
  }
  return Status::ok_status();
}

Status expect_anchor(const TensorView& t, std::string_view name, int rank,
                     std::string_view layout) {
  FMHA_RETURN_IF_ERROR(expect_rank(t, name, rank, layout));
  if (!is_attention_dtype(t.dtype)) {
    return invalid(name, " has dtype ", to_string(t.dtype),
                   "; expected float32, float16 or bfloat16 (float64 on CPU)");
  }
  const bool cpu = t.device.type == DeviceType::kCPU;
  if (!cpu && (t.device.type != DeviceType::kCUDA || t.device.index < 0)) {
    return invalid(name, " is on ", to_string(t.device),
                   ", which is no device; expected cpu or cuda:<index> with an index >= 0");
  }
  if (t.dtype == DType::kFloat64 && !cpu) {
    return Status::not_supported(
        message("dtype float64 is only supported on CPU tensors; ", name, " is float64 on ",
                to_string(t.device), " (the CUDA backend accepts float32, float16 and bfloat16)"));
  }
  return Status::ok_status();
}

Status expect_data_tensor(const Anchor& anchor, const TensorView& t, std::string_view name,
                          const Shape& shape, Access access) {
  return expect_tensor(anchor, t, name, shape, DTypeRule::kData, access,
                       access == Access::kBroadcastInput);
}

Status expect_stat_tensor(const Anchor& anchor, const TensorView& t, std::string_view name,
                          const Shape& shape, Access access) {
  return expect_tensor(anchor, t, name, shape, DTypeRule::kStat, access,
                       access == Access::kBroadcastInput);
}

Status expect_index_tensor(const Anchor& anchor, const TensorView& t, std::string_view name,
                           const Shape& shape) {
  return expect_tensor(anchor, t, name, shape, DTypeRule::kIndex, Access::kInput, false);
}

Status expect_broadcast_gradient(const Anchor& anchor, const TensorView& grad,
                                 std::string_view name, const TensorView& input,
                                 std::string_view input_name, const Shape& shape) {
  FMHA_RETURN_IF_ERROR(
      expect_tensor(anchor, grad, name, shape, DTypeRule::kData, Access::kBroadcastInput, false));
  if (grad.numel() == 0) return Status::ok_status();
  std::array<bool, kMaxRank> broadcast{};
  for (int d = 0; d < grad.rank; ++d) {
    const std::int64_t size = grad.shape[at(d)];
    broadcast[at(d)] = size > 1 && input.stride[at(d)] == 0;
    if (size <= 1 || broadcast[at(d)] == (grad.stride[at(d)] == 0)) continue;
    return invalid(name, " has stride ", grad.stride[at(d)], " on dimension ", d, " (size ", size,
                   ") where ", input_name, " has stride ", input.stride[at(d)], "; ", name,
                   " must have stride 0 exactly where ", input_name,
                   " broadcasts, and receives the sum over those dimensions");
  }
  if (grad.size(-1) > 1 && !broadcast[at(grad.rank - 1)] && grad.stride_of(-1) != 1) {
    return expect_last_stride(grad, name, /*may_broadcast=*/false);
  }
  return expect_no_overlap(grad, name, broadcast);
}

}  // namespace fmha::detail
