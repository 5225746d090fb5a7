// Makes a tensor's device current for the duration of a call and restores the caller's device.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "fmha/status.h"

namespace fmha::cuda {

class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }

  Status enter(int device) {
    cudaError_t e = cudaGetDevice(&previous_);
    if (e == cudaSuccess && previous_ != device) {
      e = cudaSetDevice(device);
      switched_ = e == cudaSuccess;
    }
    if (e != cudaSuccess) {
      return Status::backend_error(std::string("fmha: could not make CUDA device ") +
                                   std::to_string(device) + " current: " + cudaGetErrorString(e));
    }
    return Status::ok_status();
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace fmha::cuda
