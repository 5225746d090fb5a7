// Dispatch of the KV-cache entry points (include/fmha/kv_cache.h): validate, then hand the call to
// the backend of the tensors' device, like dispatch.cpp does for the other entry points.
#include "api/validate_kv_cache.h"
#include "fmha/fmha.h"
#include "reference/kv_cache.h"

#if FMHA_WITH_CUDA
#include "cuda/kv_cache_backend.h"
#endif

namespace fmha {
namespace {

#if !FMHA_WITH_CUDA
Status no_cuda_backend() {
  return Status::not_supported(
      "fmha: the tensors are on a CUDA device but this build of fmha has no CUDA backend "
      "(configure with -DFMHA_ENABLE_CUDA=ON)");
}
#endif

template <typename Params>
Status run_kv_cache(const Params& p, const TensorView& anchor, void* stream) {
  detail::KvCacheShape shape;
  FMHA_RETURN_IF_ERROR(detail::validate(p, &shape));
  if (anchor.device.type == DeviceType::kCPU) {
    reference::run(p, shape);
    return Status::ok_status();
  }
#if FMHA_WITH_CUDA
  return cuda::run(p, shape, stream);
#else
  (void)stream;
  return no_cuda_backend();
#endif
}

}  // namespace

Status check(const KvCacheAppendParams& p) {
  detail::KvCacheShape shape;
  return detail::validate(p, &shape);
}

Status check(const KvCacheForwardParams& p) {
  detail::KvCacheShape shape;
  return detail::validate(p, &shape);
}

Status run(const KvCacheAppendParams& p, void* stream) {
  return run_kv_cache(p, p.k_cache, stream);
}

Status run(const KvCacheForwardParams& p, void* stream) {
  return run_kv_cache(p, p.q, stream);
}

Status workspace_size(const KvCacheForwardParams& p, std::size_t* bytes) {
  if (bytes == nullptr) {
    return Status::invalid_argument("fmha: workspace_size got a null `bytes`; expected a pointer");
  }
  *bytes = 0;
  detail::KvCacheShape shape;
  FMHA_RETURN_IF_ERROR(detail::validate(p, &shape));
  if (p.q.device.type == DeviceType::kCPU) return Status::ok_status();
#if FMHA_WITH_CUDA
  return cuda::kv_cache_workspace_size(p, shape, bytes);
#else
  return no_cuda_backend();
#endif
}

}  // namespace fmha
