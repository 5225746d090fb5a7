// Host-side helpers of the test suite: owned buffers of any dtype with arbitrary strides, seeded
// random fill, NaN poisoning, conversion to double, and norm-wise error checks that print where
// they fail.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "fmha/tensor.h"

namespace fmha {
// Readable test names: "Dtypes/DenseDtype.AllOptions/float16  # GetParam() = float16".
inline void PrintTo(DType dtype, std::ostream* os) { *os << to_string(dtype); }
}  // namespace fmha

namespace fmha_test {

using fmha::DType;

// How a tensor's logical dimensions are laid out in memory.
struct Layout {
  std::vector<int> order;        // dims from outermost to innermost in memory; empty = row-major.
                                 // The last logical dim must stay innermost (stride 1).
  std::int64_t pad = 0;          // extra elements after every innermost row (padded strides)
  std::vector<bool> broadcast;   // dims stored once, with stride 0 (empty = none)
};

// An owned CPU buffer seen through a strided logical view. Default-constructed = "not given".
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<std::int64_t> shape, const Layout& layout = {});

  bool defined() const { return !shape_.empty(); }
  DType dtype() const { return dtype_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  const std::vector<std::int64_t>& stride() const { return stride_; }
  std::int64_t numel() const;
  // The view handed to fmha (rank 0 when not defined).
  fmha::TensorView view();

  // Element at a logical row-major index, converted to double.
  double at(std::int64_t index) const;
  // Stores `value` rounded to the dtype. Broadcast dims alias: every alias sees the new value.
  void set(std::int64_t index, double value);
  std::vector<double> to_double() const;
  void from_double(const std::vector<double>& values);
  void fill_uniform(std::mt19937_64& rng, double lo, double hi);
  // Every storage byte pattern set to NaN, so that an element the library forgets to write fails.
  void poison();
  // After poison() and a run: false when a storage element outside the logical view (padding) was
  // written, i.e. the library wrote out of bounds.
  bool padding_untouched() const;
  // What padding_untouched() found: "" when nothing outside the view was written, else the first
  // written storage element and the view's shape and strides (for the failure message).
  std::string padding_report() const;
  // After poison() and a call: true when every storage element still holds the poison (the call
  // wrote nothing).
  bool poisoned() const;
  bool bitwise_equal(const HostTensor& other) const { return bytes_ == other.bytes_; }
  // True when logical dim `dim` is broadcast (size 1 or stride 0).
  bool broadcast_dim(int dim) const;

 private:
  std::int64_t offset_of(std::int64_t index) const;

  DType dtype_ = DType::kFloat32;
  std::vector<std::int64_t> shape_, stride_;
  std::vector<unsigned char> bytes_;
};

// Row-major strides / index helpers over a logical shape.
std::int64_t product(const std::vector<std::int64_t>& shape);
std::vector<std::int64_t> unravel(std::int64_t index, const std::vector<std::int64_t>& shape);
std::string index_string(std::int64_t index, const std::vector<std::int64_t>& shape);

// Rounds a double the way storing it in `dtype` would.
double round_to(DType dtype, double x);

struct ErrorStats {
  double rel_error = 0;        // ||got - ref|| / ||ref|| (absolute when ||ref|| == 0)
  double max_abs = 0, mean_abs = 0;
  std::int64_t worst = -1;     // index of the largest absolute error
  std::int64_t first_bad = -1; // first element whose error stands out (or that is not finite)
  std::string problem;         // non-empty: a structural failure (NaN, wrong -inf, size mismatch)
};

// Elements where ref is -inf must be exactly -inf in got (masked rows of lse); they are left out
// of the norms. Any NaN, or an inf where ref is finite, is a failure.
ErrorStats compare(const std::vector<double>& got, const std::vector<double>& ref, double tol);

// gtest assertion: rel_error <= tol; on failure prints max/mean error and the first bad index.
::testing::AssertionResult close(const std::string& name, const std::vector<double>& got,
                                 const std::vector<double>& ref,
                                 const std::vector<std::int64_t>& shape, double tol);

// The SPEC §13 tolerance for one output of a problem in `dtype`: fp64 1e-12, fp32 1e-5; fp16/bf16
// 2 x the error of the same-dtype naive computation (`lowp_ref`) + 1e-4, plus the error of storing
// the exact result in the output's dtype `storage` (the correctly rounded answer must pass even when
// the naive computation is lucky, e.g. on a one-element reduction).
double tolerance(DType dtype, const std::vector<double>& ref, const std::vector<double>& lowp_ref,
                 DType storage);
inline double tolerance(DType dtype) { return tolerance(dtype, {}, {}, dtype); }

std::string dtype_name(DType dtype);

}  // namespace fmha_test
