// The CUDA backend of the KV-cache entry points (include/fmha/kv_cache.h), called by
// src/api/dispatch_kv_cache.cpp after validation.
#pragma once

#include <cstddef>

#include "api/kv_cache_problem.h"
#include "fmha/kv_cache.h"
#include "fmha/status.h"

namespace fmha::cuda {

Status run(const KvCacheForwardParams& p, const detail::KvCacheShape& shape, void* stream);
Status run(const KvCacheAppendParams& p, const detail::KvCacheShape& shape, void* stream);
Status kv_cache_workspace_size(const KvCacheForwardParams& p, const detail::KvCacheShape& shape,
                               std::size_t* bytes);

// The attention kernel of a call. kAuto, the default: the dense sm90 forward (kv_cache_forward.h)
// for calls of enough query rows a sequence (on average: 32 over a contiguous cache, 64 over pages
// of a power-of-two size, else 128; kv_cache_forward_preferred) where it applies, else the split
// kernel on tensor cores (kv_cache_mma.cuh). FMHA_KV_CACHE_KERNEL forces one: cuda-cores
// (kv_cache_kernels.cuh), tensor-cores, or forward (the sm90 forward wherever it applies, decode
// included; else tensor cores). The environment is read once per process.
enum class KvCacheKernel { kCudaCores = 0, kTensorCores = 1, kForward = 2, kAuto = 3 };
KvCacheKernel kv_cache_kernel();

// For tests: forces `*kernel` on later calls of this process, or with nullptr gives the choice back
// to the environment. Not for concurrent use with calls on other threads.
void override_kv_cache_kernel(const KvCacheKernel* kernel);

}  // namespace fmha::cuda
