// The one place where the backward's runtime values become template parameters:
// dtype -> T, max(D, Dv) -> head-dim bucket, layout -> policy. fp32 runs the sm80 kernels on every
// arch (the sm90 ones are 16-bit only). One policy (PolicyGeneral) serves
// every feature of dense and varlen attention; neighborhood attention has its own mask
// (PolicyNeighborhood).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "cuda/common/forward_policies.cuh"
#include "cuda/dispatch_bwd.h"
#include "cuda/dispatch_fwd.h"
#include "cuda/head_dim_buckets.h"
#include "cuda/sm80/launch_bwd.h"
#include "cuda/sm80/tile_sizes_bwd.h"
#if FMHA_WITH_SM90
#include "cuda/sm90/launch_bwd.h"
#include "cuda/sm90/tile_sizes_bwd.h"
#endif

namespace fmha::cuda {
namespace {

int max_dim(const BackwardParams& p) {
  return p.fwd.head_dim > p.fwd.value_dim ? p.fwd.head_dim : p.fwd.value_dim;
}

Status unsupported_head_dim(const BackwardParams& p) {
  return Status::not_supported("fmha: head_dim " + std::to_string(p.fwd.head_dim) +
                               " / value_dim " + std::to_string(p.fwd.value_dim) +
                               " is not supported by the CUDA backward kernels (sm80; supported: "
                               "1..256 each)");
}

template <typename T, bool kDkDv, typename P>
Status launch_policy(const BackwardParams& p, cudaStream_t stream) {
  switch (sm80::head_dim_bucket(max_dim(p))) {
#define FMHA_CASE(D)                                                        \
  case D:                                                                   \
    if constexpr (head_dim_bucket_built(D)) {                               \
      return kDkDv ? sm80::launch_backward_dkdv<T, D, P>(p, stream)         \
                   : sm80::launch_backward_dq<T, D, P>(p, stream);          \
    } else {                                                                \
      return head_dim_bucket_not_built(p.fwd.head_dim, p.fwd.value_dim, D); \
    }
    FMHA_CASE(32)
    FMHA_CASE(64)
    FMHA_CASE(96)
    FMHA_CASE(128)
    FMHA_CASE(160)
    FMHA_CASE(192)
    FMHA_CASE(224)
    FMHA_CASE(256)
#undef FMHA_CASE
    default:
      return unsupported_head_dim(p);
  }
}

template <typename T, bool kDkDv>
Status launch(const BackwardParams& p, cudaStream_t stream) {
  if (p.fwd.neighborhood.rank > 0) return launch_policy<T, kDkDv, PolicyNeighborhood>(p, stream);
  return launch_policy<T, kDkDv, PolicyGeneral>(p, stream);
}

template <bool kDkDv>
Status dispatch_dtype(const BackwardParams& p, DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat16:
      return launch<__half, kDkDv>(p, stream);
    case DType::kBFloat16:
      return launch<__nv_bfloat16, kDkDv>(p, stream);
    case DType::kFloat32:
      return launch<float, kDkDv>(p, stream);
    default:
      return Status::not_supported(std::string("fmha: the CUDA backward kernels got q of dtype ") +
                                   to_string(dtype) + " (supported: float32, float16, bfloat16)");
  }
}

#if FMHA_WITH_SM90
template <typename T, bool kDkDv, typename P>
Status launch_sm90_policy(const BackwardParams& p, cudaStream_t stream) {
  switch (sm80::head_dim_bucket(max_dim(p))) {
#define FMHA_CASE(D)                                                        \
  case D:                                                                   \
    if constexpr (head_dim_bucket_built(D)) {                               \
      return kDkDv ? sm90::launch_backward_dkdv<T, D, P>(p, stream)         \
                   : sm90::launch_backward_dq<T, D, P>(p, stream);          \
    } else {                                                                \
      return head_dim_bucket_not_built(p.fwd.head_dim, p.fwd.value_dim, D); \
    }
    FMHA_CASE(32)
    FMHA_CASE(64)
    FMHA_CASE(96)
    FMHA_CASE(128)
#undef FMHA_CASE
    default:
      return unsupported_head_dim(p);
  }
}

template <bool kDkDv>
Status dispatch_sm90(const BackwardParams& p, DType dtype, cudaStream_t stream) {
  const bool masked =
      p.fwd.window_left != kUnboundedWindow || p.fwd.window_right != kUnboundedWindow;
  switch (dtype) {
    case DType::kFloat16:
      return masked ? launch_sm90_policy<__half, kDkDv, PolicyWindow>(p, stream)
                    : launch_sm90_policy<__half, kDkDv, PolicyPlain>(p, stream);
    case DType::kBFloat16:
      return masked ? launch_sm90_policy<__nv_bfloat16, kDkDv, PolicyWindow>(p, stream)
                    : launch_sm90_policy<__nv_bfloat16, kDkDv, PolicyPlain>(p, stream);
    default:
      return Status::not_supported(std::string("fmha: the sm90 backward kernels got q of dtype ") +
                                   to_string(dtype) + " (supported: float16, bfloat16)");
  }
}
#endif

}  // namespace

bool use_sm90_backward(const BackwardParams& p, DType dtype, int arch) {
#if FMHA_WITH_SM90
  const ForwardParams& f = p.fwd;
  // The sm90 kernels are 16-bit only: fp32 runs the sm80 kernels on Hopper too.
  const bool sixteen_bit = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  return sixteen_bit && use_sm90_kernels(arch) && f.neighborhood.rank == 0 &&
         max_dim(p) <= sm90::kBwdMaxHeadDim && f.softcap_log2 == 0.0f && f.bias == nullptr &&
         f.rel_h == nullptr && f.num_extra == 0;
#else
  (void)p;
  (void)dtype;
  (void)arch;
  return false;
#endif
}

Status dispatch_backward_sm90_dkdv(const BackwardParams& p, DType dtype, cudaStream_t stream) {
#if FMHA_WITH_SM90
  return dispatch_sm90<true>(p, dtype, stream);
#else
  (void)p, (void)dtype, (void)stream;
  return Status::not_supported("fmha: this build has no sm90 backward kernels");
#endif
}

Status dispatch_backward_sm90_dq(const BackwardParams& p, DType dtype, cudaStream_t stream) {
#if FMHA_WITH_SM90
  return dispatch_sm90<false>(p, dtype, stream);
#else
  (void)p, (void)dtype, (void)stream;
  return Status::not_supported("fmha: this build has no sm90 backward kernels");
#endif
}

int backward_num_chunks(const BackwardParams& p, DType dtype) {
  const int d = max_dim(p);
  return dtype == DType::kFloat32 ? sm80::bwd_num_chunks<float>(sm80::head_dim_bucket(d), d)
                                  : sm80::bwd_num_chunks<__half>(sm80::head_dim_bucket(d), d);
}

std::int64_t backward_dkdv_blocks(const BackwardParams& p) {
  const std::int64_t n = sm80::kBwdBlockN;
  const std::int64_t tiles = (p.fwd.seqlen_k + n - 1) / n + (p.fwd.num_extra + n - 1) / n;
  return tiles * p.num_chunks * (p.fwd.heads / p.fwd.kv_group) * p.fwd.batch;
}

Status dispatch_backward_dkdv(const BackwardParams& p, DType dtype, cudaStream_t stream) {
  return dispatch_dtype<true>(p, dtype, stream);
}

Status dispatch_backward_dq(const BackwardParams& p, DType dtype, cudaStream_t stream) {
  return dispatch_dtype<false>(p, dtype, stream);
}

}  // namespace fmha::cuda
