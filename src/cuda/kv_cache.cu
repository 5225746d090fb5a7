// CUDA entry points of attention over a KV cache. No kernel covers them yet: every call is
// refused with kNotSupported (the CPU backend runs them).
#include "cuda/kv_cache_backend.h"

namespace fmha::cuda {
namespace {

Status not_built() {
  return Status::not_supported(
      "fmha: attention over a KV cache has no CUDA kernel in this build yet; run it on CPU "
      "tensors");
}

}  // namespace

Status run(const KvCacheForwardParams&, const detail::KvCacheShape&, void*) { return not_built(); }
Status run(const KvCacheAppendParams&, const detail::KvCacheShape&, void*) { return not_built(); }
Status kv_cache_workspace_size(const KvCacheForwardParams&, const detail::KvCacheShape&,
                               std::size_t* bytes) {
  *bytes = 0;
  return not_built();
}

}  // namespace fmha::cuda
