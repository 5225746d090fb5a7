// Fixtures of the validation tests: valid calls built on poisoned CPU buffers, and a check that a
// refused call names the problem and leaves every buffer untouched.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <string>
#include <vector>

#include "api/validate.h"
#include "fmha/fmha.h"

namespace fmha_validation {

using fmha::Device;
using fmha::DType;
using fmha::TensorView;

// Byte pattern every buffer starts with; a refused call must leave it in place.
inline constexpr unsigned char kPoison = 0xA5;

// Owns the storage behind the views of one test. A deque keeps earlier buffers in place.
class Store {
 public:
  // A row-major view on a fresh poisoned buffer.
  TensorView make(DType dtype, std::initializer_list<std::int64_t> shape, Device device = {}) {
    std::int64_t numel = 1;
    for (std::int64_t n : shape) numel *= n;
    return TensorView::contiguous(allocate(dtype, numel), dtype, shape, device);
  }
  // A strided view on a fresh poisoned buffer holding `elements` elements.
  TensorView make_strided(DType dtype, std::initializer_list<std::int64_t> shape,
                          std::initializer_list<std::int64_t> stride, std::int64_t elements) {
    return TensorView::strided(allocate(dtype, elements), dtype, shape, stride);
  }
  // An int32 [n] view holding `values` (cu_seqlens).
  TensorView offsets(std::initializer_list<std::int32_t> values, Device device = {}) {
    TensorView t = make(DType::kInt32, {static_cast<std::int64_t>(values.size())}, device);
    auto* data = static_cast<std::int32_t*>(t.data);
    for (std::int32_t v : values) *data++ = v;
    return t;
  }
  std::deque<std::vector<std::uint64_t>> snapshot() const { return buffers_; }

 private:
  void* allocate(DType dtype, std::int64_t elements) {
    const auto bytes = static_cast<std::size_t>(elements) * fmha::element_size(dtype);
    // At least one word, so an empty tensor still has a non-null, aligned data pointer.
    buffers_.emplace_back(bytes / sizeof(std::uint64_t) + 1, 0);
    std::vector<std::uint64_t>& buffer = buffers_.back();
    auto* raw = reinterpret_cast<unsigned char*>(buffer.data());
    for (std::size_t i = 0; i < buffer.size() * sizeof(std::uint64_t); ++i) raw[i] = kPoison;
    return buffer.data();
  }
  std::deque<std::vector<std::uint64_t>> buffers_;
};

// check() refuses `p` with `code` and a message that starts with "fmha: " and contains `fragment`;
// run() refuses it with the same message and writes nothing.
template <typename Params>
void expect_refused(const Store& store, const Params& p, const std::string& fragment,
                    fmha::StatusCode code = fmha::StatusCode::kInvalidArgument) {
  const fmha::Status checked = fmha::check(p);
  ASSERT_FALSE(checked.ok()) << "accepted; expected a refusal mentioning: " << fragment;
  EXPECT_EQ(checked.code(), code) << checked.message();
  EXPECT_EQ(checked.message().rfind("fmha: ", 0), 0u) << checked.message();
  EXPECT_NE(checked.message().find(fragment), std::string::npos)
      << "message: " << checked.message() << "\nexpected to contain: " << fragment;
  const auto before = store.snapshot();
  const fmha::Status ran = fmha::run(p);
  EXPECT_EQ(ran.message(), checked.message());
  EXPECT_TRUE(store.snapshot() == before) << "a refused run wrote memory";
}

template <typename Params>
void expect_valid(const Params& p) {
  const fmha::Status status = fmha::check(p);
  EXPECT_TRUE(status.ok()) << status.message();
}

// Sizes of the default dense problem: GQA (H = 2 Hkv), Lq != Lk, Dv != D.
struct Sizes {
  std::int64_t B = 2, Lq = 5, Lk = 7, H = 4, Hkv = 2, D = 8, Dv = 6;
  DType dtype = DType::kFloat32;
  DType stat = DType::kFloat32;  // lse, dlse
};

// Params filled field by field.
inline fmha::AttentionForwardParams dense_forward(Store& s, const Sizes& z = {}) {
  fmha::AttentionForwardParams p;
  p.q = s.make(z.dtype, {z.B, z.Lq, z.H, z.D});
  p.k = s.make(z.dtype, {z.B, z.Lk, z.Hkv, z.D});
  p.v = s.make(z.dtype, {z.B, z.Lk, z.Hkv, z.Dv});
  p.out = s.make(z.dtype, {z.B, z.Lq, z.H, z.Dv});
  p.lse = s.make(z.stat, {z.B, z.H, z.Lq});
  return p;
}

inline fmha::AttentionBackwardParams dense_backward(Store& s, const Sizes& z = {}) {
  fmha::AttentionBackwardParams p;
  p.q = s.make(z.dtype, {z.B, z.Lq, z.H, z.D});
  p.k = s.make(z.dtype, {z.B, z.Lk, z.Hkv, z.D});
  p.v = s.make(z.dtype, {z.B, z.Lk, z.Hkv, z.Dv});
  p.out = s.make(z.dtype, {z.B, z.Lq, z.H, z.Dv});
  p.lse = s.make(z.stat, {z.B, z.H, z.Lq});
  p.dout = s.make(z.dtype, {z.B, z.Lq, z.H, z.Dv});
  p.dlse = s.make(z.stat, {z.B, z.H, z.Lq});
  p.grads.dq = s.make(z.dtype, {z.B, z.Lq, z.H, z.D});
  p.grads.dk = s.make(z.dtype, {z.B, z.Lk, z.Hkv, z.D});
  p.grads.dv = s.make(z.dtype, {z.B, z.Lk, z.Hkv, z.Dv});
  return p;
}

}  // namespace fmha_validation
