// CUDA backend entry points of the forward: dense and varlen attention. Fills ForwardParams from
// the validated tensor views and hands it to the dispatch; no device synchronisation. The filling
// helpers are shared with the neighborhood entry point (neighborhood.cu) through forward_setup.h.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/backend.h"
#include "cuda/common/forward_params.h"
#include "cuda/common/kernel_attributes.h"
#include "cuda/common/online_softmax.cuh"
#include "cuda/device_guard.h"
#include "cuda/dispatch_fwd.h"
#include "cuda/forward_setup.h"
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

// Common tail of every forward entry point: device, grid limits, launch.
Status launch_forward_kernel(const ForwardParams& p, const TensorView& q, void* stream) {
  FMHA_RETURN_IF_ERROR(check_forward_dtype(q.dtype));
  if (p.batch == 0 || p.heads == 0 || p.seqlen_q == 0) return Status::ok_status();  // empty out
  if (p.heads > kMaxGridYZ || p.batch > kMaxGridYZ) {
    return Status::not_supported(
        "fmha: the CUDA forward kernel takes at most 65535 heads and 65535 batches (one grid "
        "dimension each); got " +
        std::to_string(p.heads) + " heads and " + std::to_string(p.batch) + " batches");
  }
  DeviceGuard guard;
  FMHA_RETURN_IF_ERROR(guard.enter(q.device.index));
  int arch = 0;
  FMHA_RETURN_IF_ERROR(check_device(q.device.index, &arch));
  return dispatch_forward(p, q.dtype, arch, static_cast<cudaStream_t>(stream));
}

Status run_dense_forward(const AttentionForwardParams& a, const detail::ProblemShape& shape,
                         const NeighborhoodGrid& grid, void* stream) {
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
  return launch_forward_kernel(p, a.q, stream);
}

Status run(const AttentionForwardParams& a, const detail::ProblemShape& shape, void* stream) {
  return run_dense_forward(a, shape, NeighborhoodGrid{}, stream);
}

Status run(const VarlenForwardParams& a, const detail::ProblemShape& shape, void* stream) {
  FMHA_RETURN_IF_ERROR(check_device_offsets(a, shape, stream));  // only when asked: a sync
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
  return launch_forward_kernel(p, a.q, stream);
}

}  // namespace fmha::cuda
