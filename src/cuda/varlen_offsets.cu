// Varlen offsets on the device, checked on the host when the caller asks (check_cu_seqlens).
#include "cuda/varlen_offsets.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "api/validate.h"
#include "cuda/device_guard.h"

namespace fmha::cuda {
namespace {

// The failure as a Status; not left as the runtime's last error for the next launch check.
Status copy_error(const char* what, cudaError_t e) {
  (void)cudaGetLastError();
  return Status::backend_error(std::string("fmha: check_cu_seqlens: ") + what + " failed: " +
                               cudaGetErrorString(e));
}

// `cu` ([B + 1] int32 on the device, unit stride as validated) copied into `host` on `stream`.
Status copy_offsets(const TensorView& cu, std::vector<std::int32_t>* host, cudaStream_t stream) {
  host->resize(static_cast<std::size_t>(cu.size(0)));
  if (host->empty()) return Status::ok_status();
  const cudaError_t e = cudaMemcpyAsync(host->data(), cu.data, host->size() * sizeof(std::int32_t),
                                        cudaMemcpyDeviceToHost, stream);
  return e == cudaSuccess ? Status::ok_status() : copy_error("cudaMemcpyAsync", e);
}

// A CPU view of the host copy, for check_offsets.
TensorView host_view(const TensorView& cu, std::vector<std::int32_t>* host) {
  TensorView v = cu;
  v.data = host->data();
  v.device = Device::cpu();
  v.stride[0] = 1;
  return v;
}

template <typename Params>
Status check(const Params& p, const detail::ProblemShape& shape, void* stream) {
  if (!p.check_cu_seqlens || p.cu_seqlens_q.device.type != DeviceType::kCUDA) {
    return Status::ok_status();
  }
  DeviceGuard guard;
  FMHA_RETURN_IF_ERROR(guard.enter(p.cu_seqlens_q.device.index));
  const auto s = static_cast<cudaStream_t>(stream);
  std::vector<std::int32_t> q, k;
  FMHA_RETURN_IF_ERROR(copy_offsets(p.cu_seqlens_q, &q, s));
  FMHA_RETURN_IF_ERROR(copy_offsets(p.cu_seqlens_k, &k, s));
  const cudaError_t e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) return copy_error("cudaStreamSynchronize", e);
  FMHA_RETURN_IF_ERROR(detail::check_offsets(host_view(p.cu_seqlens_q, &q), "cu_seqlens_q",
                                             shape.total_q, "q", shape.seqlen_q, "max_seqlen_q"));
  return detail::check_offsets(host_view(p.cu_seqlens_k, &k), "cu_seqlens_k", shape.total_k, "k",
                               shape.seqlen_k, "max_seqlen_k");
}

}  // namespace

Status check_device_offsets(const VarlenForwardParams& p, const detail::ProblemShape& shape,
                            void* stream) {
  return check(p, shape, stream);
}

Status check_device_offsets(const VarlenBackwardParams& p, const detail::ProblemShape& shape,
                            void* stream) {
  return check(p, shape, stream);
}

}  // namespace fmha::cuda
