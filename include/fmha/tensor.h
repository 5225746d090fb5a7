// Tensor views: a pointer, a dtype, a device, a shape and int64 strides (in elements).
// fmha never owns memory; every tensor crosses the API as one of these views.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace fmha {

enum class DType : std::uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat64,  // CPU backend only: lets gradients be checked by finite differences
  kInt32,    // cu_seqlens
};

const char* to_string(DType dtype);
std::size_t element_size(DType dtype);

enum class DeviceType : std::uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

std::string to_string(Device device);

// Highest rank any entry point takes: 3-D neighborhood attention, [B, X1, X2, X3, H, D].
inline constexpr int kMaxRank = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device{};
  int rank = 0;  // 0 means "not given" for optional arguments
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> stride{};  // in elements, any value >= 0

  bool defined() const { return rank > 0; }
  // Size of a dimension; negative indices count from the end, as in Python.
  std::int64_t size(int dim) const { return shape[static_cast<std::size_t>(dim < 0 ? dim + rank : dim)]; }
  std::int64_t stride_of(int dim) const {
    return stride[static_cast<std::size_t>(dim < 0 ? dim + rank : dim)];
  }
  std::int64_t numel() const;
  // "[2, 128, 16, 64]", used in error messages.
  std::string shape_string() const;

  static TensorView strided(void* data, DType dtype, int rank, const std::int64_t* shape,
                            const std::int64_t* stride, Device device = {});
  static TensorView strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                            std::initializer_list<std::int64_t> stride, Device device = {});
  // Row-major (C-contiguous) strides.
  static TensorView contiguous(void* data, DType dtype, int rank, const std::int64_t* shape,
                               Device device = {});
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               Device device = {});
};

}  // namespace fmha
