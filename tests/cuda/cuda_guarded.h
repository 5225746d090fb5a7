// Device outputs with poisoned guard rows around them: the tensor handed to fmha is the middle of a
// larger poisoned buffer (`guard` extra slices before and after it along one dimension, and padded
// rows), so that a write outside the tensor view lands in memory that the test reads back and
// checks instead of in another allocation. Writes past the guards are compute-sanitizer memcheck's.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/cuda_device_copy.h"
#include "test_util.h"

namespace fmha_cuda_test {

class GuardedOutput {
 public:
  // An output of `shape` whose dimension `dim` gets `guard` slices on each side; innermost rows
  // padded by `pad` elements. Poisoned, uploaded through `copies`.
  GuardedOutput(fmha::DType dtype, std::vector<std::int64_t> shape, int dim, std::int64_t guard,
                std::int64_t pad, DeviceCopies* copies)
      : dim_(dim), guard_(guard), rows_(shape[static_cast<std::size_t>(dim)]) {
    std::vector<std::int64_t> outer = shape;
    outer[static_cast<std::size_t>(dim)] += 2 * guard;
    fmha_test::Layout layout;
    layout.pad = pad;
    storage_ = fmha_test::HostTensor(dtype, outer, layout);
    storage_.poison();
    storage_view_ = copies->upload(storage_);
    view_ = storage_view_;
    view_.shape[static_cast<std::size_t>(dim)] = rows_;
    if (view_.data != nullptr) {
      const std::int64_t offset = guard * storage_view_.stride[static_cast<std::size_t>(dim)];
      view_.data = static_cast<char*>(view_.data) +
                   offset * static_cast<std::int64_t>(fmha::element_size(dtype));
    }
  }

  // The tensor view fmha writes (on the device).
  const fmha::TensorView& view() const { return view_; }

  // Copies the whole buffer back (after the work queued so far).
  void download() { DeviceCopies::download(storage_, storage_view_); }

  // After download(): true when nothing outside the view was written (the guard slices and the
  // row padding still hold the poison).
  ::testing::AssertionResult untouched_outside(const std::string& name) const {
    if (!storage_.padding_untouched()) {
      return ::testing::AssertionFailure() << name << ": row padding written";
    }
    const std::vector<std::int64_t>& shape = storage_.shape();
    for (std::int64_t i = 0; i < storage_.numel(); ++i) {
      const std::int64_t at = fmha_test::unravel(i, shape)[static_cast<std::size_t>(dim_)];
      if (at >= guard_ && at < guard_ + rows_) continue;
      if (!std::isnan(storage_.at(i))) {
        return ::testing::AssertionFailure()
               << name << ": element " << fmha_test::index_string(i, shape)
               << " outside the view (guard slice " << at << ") was written: " << storage_.at(i);
      }
    }
    return ::testing::AssertionSuccess();
  }

  // After download(): the values inside the view, row-major.
  std::vector<double> values() const {
    std::vector<double> inside;
    const std::vector<std::int64_t>& shape = storage_.shape();
    for (std::int64_t i = 0; i < storage_.numel(); ++i) {
      const std::int64_t at = fmha_test::unravel(i, shape)[static_cast<std::size_t>(dim_)];
      if (at >= guard_ && at < guard_ + rows_) inside.push_back(storage_.at(i));
    }
    return inside;
  }

  // Poisons the buffer again (host and device).
  void repoison() {
    storage_.poison();
    const std::size_t bytes = storage_bytes(storage_view_);
    if (bytes == 0) return;
    const cudaError_t e = copy_to_device(storage_view_.data, storage_.view().data, bytes);
    EXPECT_EQ(e, cudaSuccess) << "cudaMemcpy: " << cudaGetErrorString(e);
  }

 private:
  int dim_;
  std::int64_t guard_, rows_;
  fmha_test::HostTensor storage_;
  fmha::TensorView storage_view_, view_;
};

}  // namespace fmha_cuda_test
