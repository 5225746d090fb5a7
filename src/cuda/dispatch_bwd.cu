// The one place where the backward's runtime values become template parameters:
// dtype -> T, max(D, Dv) -> head-dim bucket, layout -> policy. fp32 runs the sm80 kernels on every
// arch (the sm90 ones are 16-bit only). One policy (PolicyGeneral) serves
// every feature of dense and varlen attention on sm80; neighborhood attention has its own mask
// (PolicyNeighborhood; on sm90 without score modifiers PolicyNeighborhoodPlain).
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
#include "cuda/sm90/dq_accumulator.cuh"
#include "cuda/sm90/launch_bwd.h"
#include "cuda/sm90/launch_bwd_fp32.h"
#include "cuda/sm90/launch_bwd_fused.h"
#include "cuda/sm90/launch_bwd_fused_d256.h"
#include "cuda/sm90/tile_copies.cuh"
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

// The dK/dV and dQ launches of one kernel generation, for launch_policy.
struct Sm80Kernels {
  template <typename T, int kD, typename P, bool kDkDv>
  static Status launch(const BackwardParams& p, cudaStream_t stream) {
    return kDkDv ? sm80::launch_backward_dkdv<T, kD, P>(p, stream)
                 : sm80::launch_backward_dq<T, kD, P>(p, stream);
  }
};
#if FMHA_WITH_SM90
struct Sm90Kernels {
  template <typename T, int kD, typename P, bool kDkDv>
  static Status launch(const BackwardParams& p, cudaStream_t stream) {
    if constexpr (kDkDv) {
      return sm90::launch_backward_dkdv<T, kD, P>(p, stream);
    } else {
      return sm90::launch_backward_dq<T, kD, P>(p, stream);
    }
  }
};
#endif

// max(D, Dv) -> head-dim bucket; a bucket left out of the build is refused with a message, one
// above kMaxBucket (instantiated for no policy that has one) as unsupported.
template <typename Kernels, typename T, bool kDkDv, typename P, int kMaxBucket = 256>
Status launch_policy(const BackwardParams& p, cudaStream_t stream) {
  switch (sm80::head_dim_bucket(max_dim(p))) {
#define FMHA_CASE(D)                                                        \
  case D:                                                                   \
    if constexpr (D > kMaxBucket) {                                         \
      return unsupported_head_dim(p);                                       \
    } else if constexpr (head_dim_bucket_built(D)) {                        \
      return Kernels::template launch<T, D, P, kDkDv>(p, stream);           \
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
  if (p.fwd.neighborhood.rank > 0) {
    return launch_policy<Sm80Kernels, T, kDkDv, PolicyNeighborhood>(p, stream);
  }
  return launch_policy<Sm80Kernels, T, kDkDv, PolicyGeneral>(p, stream);
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
bool masked(const BackwardParams& p) {
  return p.fwd.window_left != kUnboundedWindow || p.fwd.window_right != kUnboundedWindow;
}

// SAM-style rel-pos alone (no bias, softcap, mask or extra keys) on a power-of-two grid width
// dividing the dQ kernel's key tiles, rel_w rows copyable in 16-byte chunks, and the staged rows
// fitting both kernels' shared memory (227 KB on sm90): PolicyRelPos, drel_h / drel_w summed
// without atomics.
bool sm90_rel_pos_applies(const BackwardParams& p) {
  const ForwardParams& f = p.fwd;
  const int bucket = sm80::head_dim_bucket(max_dim(p));
  const std::int64_t dq_smem =
      sm90::bwd_dq_tile_bytes(bucket) + sm90::bwd_rel_pos_smem_bytes(f);
  const std::int64_t dkdv_smem =
      sm90::bwd_dkdv_tile_bytes(bucket) + sm90::bwd_rel_w_rows_bytes(f, bucket);
  return f.bias == nullptr && f.softcap_log2 == 0.0f && !masked(p) && f.num_extra == 0 &&
         f.cu_seqlens_q == nullptr &&
         rel_pos_tiles_apply(f.rel_w_size, sm90::bwd_keys_per_tile(bucket)) &&
         rel_w_staged_in_chunks(f) && dq_smem <= 227 * 1024 && dkdv_smem <= 227 * 1024;
}

// Softcap alone (no bias, rel-pos, neighborhood or extra keys) at head-dim bucket 256 in the split
// form (no dQ accumulator).
bool softcap_alone_split_d256(const BackwardParams& p) {
  const ForwardParams& f = p.fwd;
  return f.softcap_log2 > 0.0f && f.bias == nullptr && f.rel_h == nullptr &&
         f.neighborhood.rank == 0 && f.num_extra == 0 && p.dq_accum == nullptr &&
         sm80::head_dim_bucket(max_dim(p)) == 256;
}

template <typename T, bool kDkDv>
Status dispatch_sm90_policy(const BackwardParams& p, cudaStream_t stream) {
  if (p.fwd.neighborhood.rank > 0) {
    return launch_policy<Sm90Kernels, T, kDkDv, PolicyNeighborhoodPlain,
                         sm90::kBwdNeighborhoodMaxHeadDim>(p, stream);
  }
  if (p.fwd.rel_h != nullptr) return launch_policy<Sm90Kernels, T, kDkDv, PolicyRelPos>(p, stream);
  // A bias alone with pair-aligned rows: the dQ kernel in the forward's register form, the dK/dV
  // kernel (rows = keys) from staged tiles, its launch falling back to the general policy where
  // they do not apply.
  if (p.fwd.bias != nullptr && p.fwd.softcap_log2 <= 0.0f && bias_registers_apply(p.fwd)) {
    return launch_policy<Sm90Kernels, T, kDkDv, PolicyBias>(p, stream);
  }
  // Softcap alone at D 256, split: dK and dV from the warp-specialized D 256 kernel's softcap
  // policy without its dQ part, as plain / window problems take them there (launch_bwd.cuh), where
  // it applies (dense batches whose rows tensor maps describe; elsewhere it launches nothing and
  // says kNotSupported: the general policy's dK and dV part kernels). The dQ kernel stays the
  // general policy's, which recomputes P and dS with softcap's factor from the same lse and Delta.
  if constexpr (kDkDv && head_dim_bucket_built(256)) {
    if (softcap_alone_split_d256(p)) {
      const Status status = sm90::launch_backward_fused_d256<T, 256, PolicySoftcap>(p, stream);
      if (status.code() != StatusCode::kNotSupported) return status;
    }
  }
  if (p.fwd.bias != nullptr || p.fwd.softcap_log2 > 0.0f) {
    return launch_policy<Sm90Kernels, T, kDkDv, PolicyGeneral>(p, stream);
  }
  if (masked(p)) return launch_policy<Sm90Kernels, T, kDkDv, PolicyWindow>(p, stream);
  return launch_policy<Sm90Kernels, T, kDkDv, PolicyPlain>(p, stream);
}

template <bool kDkDv>
Status dispatch_sm90(const BackwardParams& p, DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat16:
      return dispatch_sm90_policy<__half, kDkDv>(p, stream);
    case DType::kBFloat16:
      return dispatch_sm90_policy<__nv_bfloat16, kDkDv>(p, stream);
    default:
      return Status::not_supported(std::string("fmha: the sm90 backward kernels got q of dtype ") +
                                   to_string(dtype) + " (supported: float16, bfloat16)");
  }
}
#endif

}  // namespace

bool use_sm90_backward(const BackwardParams& p, bool wants_dbias, DType dtype, int arch) {
#if FMHA_WITH_SM90
  const ForwardParams& f = p.fwd;
  // The sm90 kernels are 16-bit only: fp32 runs the sm80 kernels on Hopper too.
  const bool sixteen_bit = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  // Softcap and bias run the general policy; its dQ kernel writes dbias as the score's gradient,
  // which differs from the one it accumulates by softcap's factor: both together stay on sm80.
  const bool softcap_and_dbias = f.softcap_log2 > 0.0f && wants_dbias;
  // Neighborhood attention (token tiles) without score modifiers, up to D = 128.
  const bool neighborhood = f.neighborhood.rank > 0;
  const bool plain_neighborhood = f.bias == nullptr && f.rel_h == nullptr &&
                                  f.softcap_log2 == 0.0f &&
                                  max_dim(p) <= sm90::kBwdNeighborhoodMaxHeadDim;
  return sixteen_bit && use_sm90_kernels(arch) && (!neighborhood || plain_neighborhood) &&
         max_dim(p) <= sm90::kBwdMaxHeadDim && !softcap_and_dbias && f.num_extra == 0 &&
         (f.rel_h == nullptr || sm90_rel_pos_applies(p));
#else
  (void)p;
  (void)wants_dbias;
  (void)dtype;
  (void)arch;
  return false;
#endif
}

bool sm90_fused_backward_applies(const BackwardParams& p, bool wants_dbias) {
#if FMHA_WITH_SM90
  return sm90::bwd_fused_bucket(sm80::head_dim_bucket(max_dim(p))) &&
         p.fwd.neighborhood.rank == 0 &&
         p.fwd.rel_h == nullptr && !wants_dbias;
#else
  (void)p;
  (void)wants_dbias;
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

namespace {

// The head-dim bucket of a problem the warp-specialized fused kernels' terms admit (D 64 / 128:
// mainloop_bwd_fused.cuh, D 256: mainloop_bwd_fused_d256.cuh), 0 for any other: fp16/bf16 on
// sm90, the bucket built, no bias, rel-pos, neighborhood or extra keys (softcap alone runs
// PolicySoftcap), a scale they take (ws_backward_takes_scale), dense batches whose q, k, v and dout
// tensor maps describe. Which buckets have such a kernel is the callers' rule.
int ws_fused_bucket(const BackwardParams& p, DType dtype, int arch) {
#if FMHA_WITH_SM90
  const ForwardParams& f = p.fwd;
  const bool sixteen_bit = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  const std::int64_t kv_heads = f.heads / f.kv_group;
  const int bucket = sm80::head_dim_bucket(max_dim(p));
  const bool admitted =
      sixteen_bit && use_sm90_kernels(arch) && head_dim_bucket_built(bucket) &&
      f.neighborhood.rank == 0 && f.rel_h == nullptr && f.bias == nullptr && f.num_extra == 0 &&
      sm90::ws_backward_takes_scale(f) &&
      f.cu_seqlens_q == nullptr && f.seqlen_q > 0 && f.seqlen_k > 0 &&
      sm90::rows_mappable(f.q, f.head_dim, f.seqlen_q, f.heads, f.batch, f.q_row_stride,
                          f.q_head_stride, f.q_batch_stride) &&
      sm90::rows_mappable(p.dout, f.value_dim, f.seqlen_q, f.heads, f.batch, p.dout_row_stride,
                          p.dout_head_stride, p.dout_batch_stride) &&
      sm90::rows_mappable(f.k, f.head_dim, f.seqlen_k, kv_heads, f.batch, f.k_row_stride,
                          f.k_head_stride, f.k_batch_stride) &&
      sm90::rows_mappable(f.v, f.value_dim, f.seqlen_k, kv_heads, f.batch, f.v_row_stride,
                          f.v_head_stride, f.v_batch_stride);
  return admitted ? bucket : 0;
#else
  (void)p, (void)dtype, (void)arch;
  return 0;
#endif
}

}  // namespace

bool use_sm90_fused_backward(const BackwardParams& p, DType dtype, int arch) {
#if FMHA_WITH_SM90
  return sm90::bwd_fused_ws_bucket(ws_fused_bucket(p, dtype, arch));
#else
  (void)p, (void)dtype, (void)arch;
  return false;
#endif
}

FusedAccumulatorSize sm90_fused_backward_accumulator(BackwardParams* p, std::int64_t inner,
                                                     bool varlen) {
#if FMHA_WITH_SM90
  const std::int64_t outer = varlen ? 1 : p->fwd.batch;
  const bool d64 = sm80::head_dim_bucket(max_dim(*p)) == 64;
  if (d64) {
    sm90::set_dq_accumulator_strides<64>(p, inner, varlen);
  } else {
    sm90::set_dq_accumulator_strides<128>(p, inner, varlen);
  }
  const std::int64_t floats = outer * p->fwd.heads * p->accum_head_stride;
  const std::int64_t tile = d64 ? sm90::DqAccumulator<64>::kTileFloats
                                : sm90::DqAccumulator<128>::kTileFloats;
  const std::int64_t rows = d64 ? sm90::DqAccumulator<64>::kM : sm90::DqAccumulator<128>::kM;
  return {floats, floats / tile, varlen ? inner : (inner + rows - 1) / rows * rows};
#else
  (void)p, (void)varlen;
  return {0, 0, inner};
#endif
}

Status dispatch_backward_sm90_fused(const BackwardParams& p, DType dtype, cudaStream_t stream) {
#if FMHA_WITH_SM90
  // Softcap (alone: ws_fused_bucket) with or without a mask: PolicySoftcap, whose MaskWindow
  // serves both.
  auto by_bucket = [&](auto type) -> Status {
    using T = decltype(type);
    const bool window = masked(p);
    const bool softcap = p.fwd.softcap_log2 > 0.0f;
    if (sm80::head_dim_bucket(max_dim(p)) == 64) {
      if constexpr (head_dim_bucket_built(64)) {
        if (softcap) return sm90::launch_backward_fused<T, 64, PolicySoftcap>(p, stream);
        return window ? sm90::launch_backward_fused<T, 64, PolicyWindow>(p, stream)
                      : sm90::launch_backward_fused<T, 64, PolicyPlain>(p, stream);
      }
    } else {
      if constexpr (head_dim_bucket_built(128)) {
        if (softcap) return sm90::launch_backward_fused<T, 128, PolicySoftcap>(p, stream);
        return window ? sm90::launch_backward_fused<T, 128, PolicyWindow>(p, stream)
                      : sm90::launch_backward_fused<T, 128, PolicyPlain>(p, stream);
      }
    }
    return Status::backend_error("fmha: internal error: no fused sm90 backward for this problem");
  };
  switch (dtype) {
    case DType::kFloat16:
      return by_bucket(__half{});
    case DType::kBFloat16:
      return by_bucket(__nv_bfloat16{});
    default:
      return Status::not_supported(std::string("fmha: the fused sm90 backward got q of dtype ") +
                                   to_string(dtype) + " (supported: float16, bfloat16)");
  }
#else
  (void)p, (void)dtype, (void)stream;
  return Status::not_supported("fmha: this build has no sm90 backward kernels");
#endif
}

bool use_sm90_fp32_backward(const BackwardParams& p, DType dtype, int arch) {
#if FMHA_WITH_SM90
  return dtype == DType::kFloat32 && use_sm90_kernels(arch) && head_dim_bucket_built(64) &&
         fp32_planes_apply(p.fwd);
#else
  (void)p, (void)dtype, (void)arch;
  return false;
#endif
}

Status dispatch_backward_sm90_fp32(const BackwardParams& p, cudaStream_t stream) {
#if FMHA_WITH_SM90
  if constexpr (head_dim_bucket_built(64)) {
    return masked(p) ? sm90::launch_backward_fp32<float, 64, PolicyWindow>(p, stream)
                     : sm90::launch_backward_fp32<float, 64, PolicyPlain>(p, stream);
  }
#endif
  (void)p, (void)stream;
  return Status::not_supported("fmha: this build has no sm90 fp32 backward kernels");
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
