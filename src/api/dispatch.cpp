// Dispatch: validate, then hand the call to the backend that owns the tensors' device.
#include <type_traits>

#include "api/validate.h"
#include "cpu/backend.h"
#include "cpu/kernels.h"
#include "fmha/fmha.h"
#include "reference/reference.h"

#if FMHA_WITH_CUDA
#include "cuda/backend.h"
#endif

namespace fmha {
namespace {

#if !FMHA_WITH_CUDA
Status cuda_unavailable() {
  return Status::not_supported(
      "fmha: the tensors are on a CUDA device but this build of fmha has no CUDA backend "
      "(configure with -DFMHA_ENABLE_CUDA=ON)");
}
#endif

// CPU calls: the fast backend (src/cpu/) for the dense, varlen and neighborhood calls it supports unless the
// options ask for the reference, the float64 reference for everything else.
template <typename Params>
void run_cpu(const Params& p, const detail::ProblemShape& shape) {
  constexpr bool kFastEntryPoint =
      std::is_same_v<Params, AttentionForwardParams> || std::is_same_v<Params, AttentionBackwardParams> ||
      std::is_same_v<Params, VarlenForwardParams> || std::is_same_v<Params, VarlenBackwardParams> ||
      std::is_same_v<Params, NeighborhoodForwardParams> ||
      std::is_same_v<Params, NeighborhoodBackwardParams>;
  if constexpr (kFastEntryPoint) {
    if (p.options.cpu_backend == CpuBackend::kAuto && cpu::supports(p, shape)) {
      return cpu::run(p, shape);
    }
  }
  reference::run(p, shape);
}

// Runs a validated shaped problem (dense, varlen, neighborhood) on its device's backend.
template <typename Params>
Status run_shaped(const Params& p, void* stream) {
  detail::ProblemShape shape;
  FMHA_RETURN_IF_ERROR(detail::validate(p, &shape));
  if (p.q.device.type == DeviceType::kCPU) {
    run_cpu(p, shape);
    return Status::ok_status();
  }
#if FMHA_WITH_CUDA
  return cuda::run(p, shape, stream);
#else
  (void)stream;
  return cuda_unavailable();
#endif
}

// The scratch bytes a validated shaped problem takes on its device (fmha.h's workspace_size).
template <typename Params>
Status workspace_size_shaped(const Params& p, std::size_t* bytes) {
  if (bytes == nullptr) {
    return Status::invalid_argument("fmha: workspace_size got a null `bytes`; expected a pointer");
  }
  *bytes = 0;
  detail::ProblemShape shape;
  FMHA_RETURN_IF_ERROR(detail::validate(p, &shape));
  if (p.q.device.type == DeviceType::kCPU) return Status::ok_status();
#if FMHA_WITH_CUDA
  return cuda::workspace_size(p, shape, bytes);
#else
  return cuda_unavailable();
#endif
}

template <typename Params>
Status check_shaped(const Params& p) {
  detail::ProblemShape shape;
  return detail::validate(p, &shape);
}

template <typename Params>
Status run_merge(const Params& p, void* stream) {
  FMHA_RETURN_IF_ERROR(detail::validate(p));
  if (p.out.device.type == DeviceType::kCPU) {
    reference::run(p);
    return Status::ok_status();
  }
#if FMHA_WITH_CUDA
  return cuda::run(p, stream);
#else
  (void)stream;
  return cuda_unavailable();
#endif
}

}  // namespace

Status check(const AttentionForwardParams& p) { return check_shaped(p); }
Status check(const AttentionBackwardParams& p) { return check_shaped(p); }
Status check(const VarlenForwardParams& p) { return check_shaped(p); }
Status check(const VarlenBackwardParams& p) { return check_shaped(p); }
Status check(const NeighborhoodForwardParams& p) { return check_shaped(p); }
Status check(const NeighborhoodBackwardParams& p) { return check_shaped(p); }
Status check(const MergeForwardParams& p) { return detail::validate(p); }
Status check(const MergeBackwardParams& p) { return detail::validate(p); }

Status run(const AttentionForwardParams& p, void* stream) { return run_shaped(p, stream); }
Status run(const AttentionBackwardParams& p, void* stream) { return run_shaped(p, stream); }
Status run(const VarlenForwardParams& p, void* stream) { return run_shaped(p, stream); }
Status run(const VarlenBackwardParams& p, void* stream) { return run_shaped(p, stream); }
Status run(const NeighborhoodForwardParams& p, void* stream) { return run_shaped(p, stream); }
Status run(const NeighborhoodBackwardParams& p, void* stream) { return run_shaped(p, stream); }
Status run(const MergeForwardParams& p, void* stream) { return run_merge(p, stream); }
Status run(const MergeBackwardParams& p, void* stream) { return run_merge(p, stream); }

Status workspace_size(const AttentionForwardParams& p, std::size_t* bytes) {
  return workspace_size_shaped(p, bytes);
}
Status workspace_size(const AttentionBackwardParams& p, std::size_t* bytes) {
  return workspace_size_shaped(p, bytes);
}
Status workspace_size(const VarlenForwardParams& p, std::size_t* bytes) {
  return workspace_size_shaped(p, bytes);
}
Status workspace_size(const VarlenBackwardParams& p, std::size_t* bytes) {
  return workspace_size_shaped(p, bytes);
}
Status workspace_size(const NeighborhoodForwardParams& p, std::size_t* bytes) {
  return workspace_size_shaped(p, bytes);
}
Status workspace_size(const NeighborhoodBackwardParams& p, std::size_t* bytes) {
  return workspace_size_shaped(p, bytes);
}

bool built_with_cuda() { return FMHA_WITH_CUDA != 0; }
const char* version() { return FMHA_VERSION_STRING; }
const char* cpu_isa() { return cpu::to_string(cpu::selected_isa()); }

}  // namespace fmha
