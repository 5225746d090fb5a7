// CUDA backend entry points of the forward: dense and varlen attention. Fills ForwardParams from
// the validated tensor views and hands it to the dispatch; no device synchronisation. The filling
// helpers are shared with the neighborhood entry point (neighborhood.cu) through forward_setup.h.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/backend.h"
#include "cuda/call_workspace.h"
#include "cuda/common/forward_params.h"
#include "cuda/common/kernel_attributes.h"
#include "cuda/common/online_softmax.cuh"
#include "cuda/device_guard.h"
#include "cuda/dispatch_fwd.h"
#include "cuda/forward_setup.h"
#include "cuda/head_dim_buckets.h"
#include "cuda/sm90/fp32_plane_sizes.h"
#include "cuda/sm90/launch_limits.h"
#include "cuda/varlen_offsets.h"

namespace fmha::cuda {
namespace {

Status cuda_error(const char* what, cudaError_t e) {
  return Status::backend_error(std::string("fmha: ") + what + ": " + cudaGetErrorString(e));
}

// The sm80 kernel uses bf16/fp16/tf32 mma.sync, which needs compute capability 8.0. *arch gets the
// device's compute capability as major * 10 + minor (the dispatch picks the kernel generation).
Status check_device(int device, int* arch) {
  const cudaError_t e = compute_capability(device, arch);  // asked once per device
  if (e != cudaSuccess) return cuda_error("cudaDeviceGetAttribute failed", e);
  if (*arch < 80) {
    return Status::not_supported(
        "fmha: the CUDA forward kernel needs compute capability 8.0 or newer (fp16/bf16/tf32 "
        "mma.sync tensor cores); detected GPU: sm_" +
        std::to_string(*arch));
  }
  return Status::ok_status();
}

// Element strides of a bias-like tensor ([B, H, Lq, *]): a dimension of size 1 broadcasts like a
// stride of 0 (validation accepts both), so it reads element 0 whatever the index.
void broadcast_strides(const TensorView& t, std::int64_t (&strides)[4]) {
  for (std::size_t d = 0; d < 4; ++d) strides[d] = t.shape[d] == 1 ? 0 : t.stride[d];
}

}  // namespace

std::int64_t chunk_elements(DType dtype) {
  return dtype == DType::kFloat32 ? 4 : 8;
}

bool rows_aligned16(const TensorView& t) {
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) return false;
  for (int d = 0; d + 1 < t.rank; ++d) {
    if (t.stride[static_cast<std::size_t>(d)] % chunk_elements(t.dtype) != 0) return false;
  }
  return true;
}

// Options shared by dense, varlen and neighborhood: scale, softcap, masks, bias, rel-pos, sinks,
// extra keys.
void fill_forward_options(const AttentionOptions& o, const detail::ProblemShape& shape,
                          ForwardParams* p) {
  p->scale_log2 = shape.scale * kLog2e;
  p->allow_tf32 = o.allow_tf32;
  if (o.softcap > 0.0f) {
    p->softcap_log2 = o.softcap * kLog2e;
    p->scale_over_softcap = shape.scale / o.softcap;
  }
  p->bottom_right = o.causal_alignment == CausalAlignment::kBottomRight;
  p->window_left = o.window_left < 0 ? kUnboundedWindow : o.window_left;
  p->window_right = o.window_right < 0 ? kUnboundedWindow : o.window_right;
  if (o.causal) p->window_right = 0;  // causal is the window (unbounded, 0); intersect
  if (o.bias.defined()) {
    p->bias = o.bias.data;
    broadcast_strides(o.bias, p->bias_stride);
  }
  if (o.rel_h.defined()) {
    p->rel_h = o.rel_h.data;
    p->rel_w = o.rel_w.data;
    broadcast_strides(o.rel_h, p->rel_h_stride);
    broadcast_strides(o.rel_w, p->rel_w_stride);
    p->rel_w_size = shape.rel_w_size;
  }
  if (o.sinks.defined()) {
    p->sinks = static_cast<const float*>(o.sinks.data);
    p->sinks_stride = o.sinks.stride[0];
  }
  if (o.extra_k.defined() && shape.num_extra > 0) {
    p->extra_k = o.extra_k.data;
    p->extra_v = o.extra_v.data;
    p->num_extra = shape.num_extra;
    p->extra_k_batch_stride = o.extra_k.stride[0];
    p->extra_k_row_stride = o.extra_k.stride[1];
    p->extra_k_head_stride = o.extra_k.stride[2];
    p->extra_v_batch_stride = o.extra_v.stride[0];
    p->extra_v_row_stride = o.extra_v.stride[1];
    p->extra_v_head_stride = o.extra_v.stride[2];
  }
}

void fill_forward_sizes(const detail::ProblemShape& shape, ForwardParams* p) {
  p->batch = shape.batch;
  p->seqlen_q = shape.seqlen_q;
  p->seqlen_k = shape.seqlen_k;
  p->total_q = shape.total_q;
  p->total_k = shape.total_k;
  p->heads = static_cast<int>(shape.heads);
  p->kv_group = static_cast<int>(shape.heads / shape.kv_heads);
  p->head_dim = static_cast<int>(shape.head_dim);
  p->value_dim = static_cast<int>(shape.value_dim);
}

void fill_forward_alignment(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const AttentionOptions& o, ForwardParams* p) {
  const std::int64_t chunk = chunk_elements(q.dtype);
  const bool whole_chunks = p->head_dim % chunk == 0 && p->value_dim % chunk == 0;
  bool loads = whole_chunks && rows_aligned16(q) && rows_aligned16(k) && rows_aligned16(v);
  if (p->num_extra > 0) loads = loads && rows_aligned16(o.extra_k) && rows_aligned16(o.extra_v);
  p->vector_loads = loads;
  p->vector_stores = p->value_dim % chunk == 0 && rows_aligned16(out);
}

namespace {

// Scratch bytes of a forward on `arch` (the current device's): the sm90 fp32 kernels' operand
// planes, or the persistent sm90 kernel's tile counter when it takes its tiles dynamically and may
// have more of them than blocks (tiles counted at 64 query rows, fewer than any sm90 forward tile
// has, so the count is an upper bound; small calls need no counter and allocate nothing).
std::size_t forward_scratch_bytes(const ForwardParams& p, DType dtype, int arch) {
  if (!use_sm90_kernels(arch)) return 0;
  if (dtype == DType::kFloat32) {
    const bool planes = head_dim_bucket_built(64) && fp32_planes_apply(p);
    return planes ? scratch_round_up(static_cast<std::size_t>(
                        sm90::fp32_forward_planes_floats(p) * std::int64_t{sizeof(float)}))
                  : 0;
  }
  if (!sm90::forward_tiles_dynamic(p)) return 0;
  const std::int64_t tiles = (p.seqlen_q + 63) / 64 * p.heads * p.batch;
  const bool counted = tiles > sm90::persistent_blocks() || sm90::dynamic_tiles_requested();
  return counted ? kScratchAlignment : 0;
}

// The checks every forward entry point makes before its device work (dtype, grid limits), then
// the device guard and the device's architecture. *empty: nothing to compute (an empty out).
Status enter_forward(const ForwardParams& p, const TensorView& q, DeviceGuard* guard, int* arch,
                     bool* empty) {
  FMHA_RETURN_IF_ERROR(check_forward_dtype(q.dtype));
  *empty = p.batch == 0 || p.heads == 0 || p.seqlen_q == 0;
  if (*empty) return Status::ok_status();
  if (p.heads > kMaxGridYZ || p.batch > kMaxGridYZ) {
    return Status::not_supported(
        "fmha: the CUDA forward kernel takes at most 65535 heads and 65535 batches (one grid "
        "dimension each); got " +
        std::to_string(p.heads) + " heads and " + std::to_string(p.batch) + " batches");
  }
  FMHA_RETURN_IF_ERROR(guard->enter(q.device.index));
  return check_device(q.device.index, arch);
}

ForwardParams dense_forward_params(const AttentionForwardParams& a,
                                   const detail::ProblemShape& shape, const NeighborhoodGrid& grid) {
  ForwardParams p;
  fill_forward_sizes(shape, &p);
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.out = a.out.data;
  p.q_batch_stride = a.q.stride[0], p.q_row_stride = a.q.stride[1], p.q_head_stride = a.q.stride[2];
  p.k_batch_stride = a.k.stride[0], p.k_row_stride = a.k.stride[1], p.k_head_stride = a.k.stride[2];
  p.v_batch_stride = a.v.stride[0], p.v_row_stride = a.v.stride[1], p.v_head_stride = a.v.stride[2];
  p.out_batch_stride = a.out.stride[0], p.out_row_stride = a.out.stride[1];
  p.out_head_stride = a.out.stride[2];
  if (a.lse.defined()) {
    p.lse = static_cast<float*>(a.lse.data);
    p.lse_batch_stride = a.lse.stride[0];
    p.lse_head_stride = a.lse.stride[1];
    p.lse_row_stride = a.lse.stride[2];
  }
  fill_forward_options(a.options, shape, &p);
  set_neighborhood_mask(grid, &p);
  fill_forward_alignment(a.q, a.k, a.v, a.out, a.options, &p);
  return p;
}

ForwardParams varlen_forward_params(const VarlenForwardParams& a,
                                    const detail::ProblemShape& shape) {
  ForwardParams p;
  fill_forward_sizes(shape, &p);
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.out = a.out.data;
  // Packed rows: no batch stride; sequence b starts at row cu_seqlens[b].
  p.q_row_stride = a.q.stride[0], p.q_head_stride = a.q.stride[1];
  p.k_row_stride = a.k.stride[0], p.k_head_stride = a.k.stride[1];
  p.v_row_stride = a.v.stride[0], p.v_head_stride = a.v.stride[1];
  p.out_row_stride = a.out.stride[0], p.out_head_stride = a.out.stride[1];
  if (a.lse.defined()) {  // [H, total_q]
    p.lse = static_cast<float*>(a.lse.data);
    p.lse_head_stride = a.lse.stride[0];
    p.lse_row_stride = a.lse.stride[1];
  }
  p.cu_seqlens_q = static_cast<const std::int32_t*>(a.cu_seqlens_q.data);
  p.cu_seqlens_k = static_cast<const std::int32_t*>(a.cu_seqlens_k.data);
  fill_forward_options(a.options, shape, &p);
  fill_forward_alignment(a.q, a.k, a.v, a.out, a.options, &p);
  return p;
}

}  // namespace

// Common tail of every forward entry point: device, grid limits, scratch memory, launch.
Status launch_forward_kernel(const ForwardParams& p, const TensorView& q,
                             const Workspace& workspace, void* stream) {
  DeviceGuard guard;
  int arch = 0;
  bool empty = false;
  FMHA_RETURN_IF_ERROR(enter_forward(p, q, &guard, &arch, &empty));
  if (empty) return Status::ok_status();
  const std::size_t bytes = forward_scratch_bytes(p, q.dtype, arch);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  CallWorkspace scratch(workspace, q.device.index, cuda_stream);
  FMHA_RETURN_IF_ERROR(scratch.fits(bytes));
  ForwardParams launched = p;
  FMHA_RETURN_IF_ERROR(scratch.take(bytes, &launched.scratch));
  const Status s = dispatch_forward(launched, q.dtype, arch, cuda_stream);
  const Status released = scratch.release();
  return s.ok() ? released : s;
}

Status forward_workspace_bytes(const ForwardParams& p, const TensorView& q, std::size_t* bytes) {
  DeviceGuard guard;
  int arch = 0;
  bool empty = false;
  FMHA_RETURN_IF_ERROR(enter_forward(p, q, &guard, &arch, &empty));
  *bytes = empty ? 0 : forward_scratch_bytes(p, q.dtype, arch);
  return Status::ok_status();
}

Status run_dense_forward(const AttentionForwardParams& a, const detail::ProblemShape& shape,
                         const NeighborhoodGrid& grid, void* stream) {
  return launch_forward_kernel(dense_forward_params(a, shape, grid), a.q, a.workspace, stream);
}

Status dense_forward_workspace_bytes(const AttentionForwardParams& a,
                                     const detail::ProblemShape& shape,
                                     const NeighborhoodGrid& grid, std::size_t* bytes) {
  return forward_workspace_bytes(dense_forward_params(a, shape, grid), a.q, bytes);
}

Status run(const AttentionForwardParams& a, const detail::ProblemShape& shape, void* stream) {
  return run_dense_forward(a, shape, NeighborhoodGrid{}, stream);
}

Status workspace_size(const AttentionForwardParams& a, const detail::ProblemShape& shape,
                      std::size_t* bytes) {
  return dense_forward_workspace_bytes(a, shape, NeighborhoodGrid{}, bytes);
}

Status run(const VarlenForwardParams& a, const detail::ProblemShape& shape, void* stream) {
  FMHA_RETURN_IF_ERROR(check_device_offsets(a, shape, stream));  // only when asked: a sync
  return launch_forward_kernel(varlen_forward_params(a, shape), a.q, a.workspace, stream);
}

Status workspace_size(const VarlenForwardParams& a, const detail::ProblemShape& shape,
                      std::size_t* bytes) {
  return forward_workspace_bytes(varlen_forward_params(a, shape), a.q, bytes);
}

}  // namespace fmha::cuda
