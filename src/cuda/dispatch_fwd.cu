// The one place where the forward's runtime values become template parameters:
// dtype -> T, max(D, Dv) -> head-dim bucket, layout and enabled features -> policy.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda/common/forward_policies.cuh"
#include "cuda/dispatch_fwd.h"
#include "cuda/head_dim_buckets.h"
#include "cuda/sm80/launch_fwd.h"
#include "cuda/sm80/tile_sizes.h"
#if FMHA_WITH_SM90
#include "cuda/sm90/launch_fwd.h"
#include "cuda/sm90/launch_fwd_fp32.h"
#endif

namespace fmha::cuda {
namespace {

// Plain attention (no causal/window mask, softcap, bias or rel-pos) takes the lean variant; sinks
// and extra keys are runtime features of every policy.
bool needs_score_modifiers(const ForwardParams& p) {
  return p.softcap_log2 > 0.0f || p.bias != nullptr || p.rel_h != nullptr;
}
bool needs_mask(const ForwardParams& p) {
  return p.window_left != kUnboundedWindow || p.window_right != kUnboundedWindow;
}
// SAM-style rel-pos with nothing else: PolicyRelPos on sm90 (its launch falls back to the general
// policy where the layout does not apply).
bool rel_pos_alone(const ForwardParams& p) {
  return p.rel_h != nullptr && p.bias == nullptr && p.softcap_log2 <= 0.0f && !needs_mask(p);
}
// An additive bias with nothing else but a mask: PolicyBias on sm90 (its launch falls back to the
// general policy where the bias's layout does not apply).
bool bias_alone(const ForwardParams& p) {
  return p.bias != nullptr && p.rel_h == nullptr && p.softcap_log2 <= 0.0f;
}
// Softcap with nothing else but a mask: PolicySoftcap on sm90.
bool softcap_alone(const ForwardParams& p) {
  return p.softcap_log2 > 0.0f && p.bias == nullptr && p.rel_h == nullptr;
}
bool needs_general_policy(const ForwardParams& p) {
  return needs_mask(p) || needs_score_modifiers(p);
}

// fp32 runs the sm80 kernels on every arch but where fp32_planes_apply on Hopper (the other sm90
// kernels are 16-bit only).
template <typename T, int kD>
Status dispatch_policy(const ForwardParams& p, int arch, cudaStream_t stream) {
#if FMHA_WITH_SM90
  if constexpr (std::is_same_v<T, float> && kD <= 64 && head_dim_bucket_built(64)) {
    if (use_sm90_kernels(arch) && fp32_planes_apply(p)) {
      return needs_mask(p) ? sm90::launch_forward_fp32<float, 64, PolicyWindow>(p, stream)
                           : sm90::launch_forward_fp32<float, 64, PolicyPlain>(p, stream);
    }
  }
  if constexpr (!std::is_same_v<T, float>) {
    if (use_sm90_kernels(arch)) {
      if (p.neighborhood.rank > 0) {
        return needs_score_modifiers(p)
                   ? sm90::launch_forward<T, kD, PolicyNeighborhood>(p, stream)
                   : sm90::launch_forward<T, kD, PolicyNeighborhoodPlain>(p, stream);
      }
      // A KV cache (kv_cache_forward.cu: seqused_k, maybe a block table): the cache policies,
      // softcap or not (the KV-cache API has neither bias nor rel-pos).
      if (p.seqused_k != nullptr && p.bias == nullptr && p.rel_h == nullptr) {
        return p.softcap_log2 > 0.0f ? sm90::launch_forward<T, kD, PolicyCacheSoftcap>(p, stream)
                                     : sm90::launch_forward<T, kD, PolicyCache>(p, stream);
      }
      if (rel_pos_alone(p)) return sm90::launch_forward<T, kD, PolicyRelPos>(p, stream);
      if (bias_alone(p)) return sm90::launch_forward<T, kD, PolicyBias>(p, stream);
      if (softcap_alone(p)) return sm90::launch_forward<T, kD, PolicySoftcap>(p, stream);
      if (needs_score_modifiers(p)) return sm90::launch_forward<T, kD, PolicyGeneral>(p, stream);
      if (needs_mask(p) || sm90::plain_on_window_kernel<kD>(p.seqlen_q)) {
        return sm90::launch_forward<T, kD, PolicyWindow>(p, stream);
      }
      return sm90::launch_forward<T, kD, PolicyPlain>(p, stream);
    }
  }
  (void)arch;
#else
  (void)arch;
#endif
  if (p.neighborhood.rank > 0) return sm80::launch_forward<T, kD, PolicyNeighborhood>(p, stream);
  if (needs_general_policy(p)) return sm80::launch_forward<T, kD, PolicyGeneral>(p, stream);
  return sm80::launch_forward<T, kD, PolicyPlain>(p, stream);
}

template <typename T, int kD>
Status dispatch_bucket(const ForwardParams& p, int arch, cudaStream_t stream) {
  if constexpr (head_dim_bucket_built(kD)) {
    return dispatch_policy<T, kD>(p, arch, stream);
  } else {
    (void)arch, (void)stream;
    return head_dim_bucket_not_built(p.head_dim, p.value_dim, kD);
  }
}

template <typename T>
Status dispatch_head_dim(const ForwardParams& p, int arch, cudaStream_t stream) {
  const int head_dim = p.head_dim > p.value_dim ? p.head_dim : p.value_dim;
  switch (sm80::head_dim_bucket(head_dim)) {
    case 32:
      return dispatch_bucket<T, 32>(p, arch, stream);
    case 64:
      return dispatch_bucket<T, 64>(p, arch, stream);
    case 96:
      return dispatch_bucket<T, 96>(p, arch, stream);
    case 128:
      return dispatch_bucket<T, 128>(p, arch, stream);
    case 160:
      return dispatch_bucket<T, 160>(p, arch, stream);
    case 192:
      return dispatch_bucket<T, 192>(p, arch, stream);
    case 224:
      return dispatch_bucket<T, 224>(p, arch, stream);
    case 256:
      return dispatch_bucket<T, 256>(p, arch, stream);
    default:
      return Status::not_supported(
          "fmha: head_dim " + std::to_string(p.head_dim) + " / value_dim " +
          std::to_string(p.value_dim) +
          " is not supported by the CUDA forward kernel (sm80; supported: 1..256 each)");
  }
}

}  // namespace

bool fp32_planes_apply(const ForwardParams& p) {
  return p.neighborhood.rank == 0 && !needs_score_modifiers(p) && p.cu_seqlens_q == nullptr &&
         p.num_extra == 0 && p.head_dim <= 64 && p.value_dim <= 64;
}

Status check_forward_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
      return Status::ok_status();
    case DType::kFloat64:
      return Status::not_supported(
          "fmha: the CUDA backend does not support float64 (the reference CPU backend does); got "
          "q of dtype float64");
    default:
      return Status::not_supported(std::string("fmha: the CUDA forward kernel got q of dtype ") +
                                   to_string(dtype) + " (supported: float32, float16, bfloat16)");
  }
}

bool use_sm90_kernels(int arch) {
#if FMHA_WITH_SM90
  // Read once: FMHA_CUDA_KERNELS=sm80 runs the mma.sync kernels on Hopper too (tests, benchmarks).
  static const bool forced_sm80 = [] {
    const char* value = std::getenv("FMHA_CUDA_KERNELS");
    return value != nullptr && std::strcmp(value, "sm80") == 0;
  }();
  return arch == 90 && !forced_sm80;
#else
  (void)arch;
  return false;
#endif
}

Status dispatch_forward(const ForwardParams& p, DType dtype, int arch, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat16:
      return dispatch_head_dim<__half>(p, arch, stream);
    case DType::kBFloat16:
      return dispatch_head_dim<__nv_bfloat16>(p, arch, stream);
    case DType::kFloat32:
      return dispatch_head_dim<float>(p, arch, stream);
    default:
      return check_forward_dtype(dtype);
  }
}

}  // namespace fmha::cuda
