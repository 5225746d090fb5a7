// Definition of sm90::launch_backward_fp32; included only by its instantiation file.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/common/kernel_attributes.h"
#include "cuda/sm90/fp32_planes.cuh"
#include "cuda/sm90/launch_bwd_fp32.h"
#include "cuda/sm90/mainloop_bwd_fp32.cuh"

namespace fmha::cuda::sm90 {

// The planes of p in `workspace` (fp32_backward_planes_floats of them, fp32_plane_sizes.h): their
// layout in *planes, then the passes that write them, on `stream`.
inline cudaError_t write_backward_planes(const BackwardParams& p, float* workspace,
                                         Fp32BackwardPlanes* planes, cudaStream_t stream) {
  const ForwardParams& f = p.fwd;
  const std::int64_t kv_heads = f.heads / f.kv_group;
  planes->q_rows = round_up(f.seqlen_q, kFp32BwdBlock);
  planes->k_rows = round_up(f.seqlen_k, kFp32BwdBlock);
  const PlaneFloats n = backward_plane_floats(f);
  const std::int64_t q_plane = n.q, k_plane = n.k;
  float* const q = workspace;
  float* const dout = q + q_plane;
  float* const qt = dout + q_plane;
  float* const doutt = qt + q_plane;
  float* const k = doutt + q_plane;
  float* const v = k + k_plane;
  float* const kt = v + k_plane;
  planes->q = q, planes->dout = dout, planes->qt = qt, planes->doutt = doutt;
  planes->k = k, planes->v = v, planes->kt = kt;
  // The passes, one an input: Q, dO and K into both planes, V into its row plane.
  struct Pass {
    const void* src;
    std::int64_t batch_stride, row_stride, head_stride, heads, rows;
    int cols;
    float* rows_dst;
    float* transposed_dst;
    std::int64_t padded_rows;
  };
  const Pass passes[] = {
      {f.q, f.q_batch_stride, f.q_row_stride, f.q_head_stride, f.heads, f.seqlen_q, f.head_dim, q,
       qt, planes->q_rows},
      {p.dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride, f.heads, f.seqlen_q,
       f.value_dim, dout, doutt, planes->q_rows},
      {f.k, f.k_batch_stride, f.k_row_stride, f.k_head_stride, kv_heads, f.seqlen_k, f.head_dim, k,
       kt, planes->k_rows},
      {f.v, f.v_batch_stride, f.v_row_stride, f.v_head_stride, kv_heads, f.seqlen_k, f.value_dim, v,
       nullptr, planes->k_rows},
  };
  cudaError_t e = cudaSuccess;
  for (const Pass& pass : passes) {
    if (e == cudaSuccess) {
      e = split_planes(pass.src, pass.batch_stride, pass.row_stride, pass.head_stride, f.batch,
                       pass.heads, pass.rows, pass.cols, pass.rows_dst, pass.transposed_dst,
                       pass.padded_rows, stream);
    }
  }
  return e;
}

// One of the two kernels over `rows` rows of blocks of kFp32BwdBlock, `heads` heads, the batch.
template <auto kKernel>
cudaError_t launch_fp32_backward_kernel(int smem, std::int64_t rows, std::int64_t heads,
                                        const BackwardParams& p, const Fp32BackwardPlanes& planes,
                                        cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  cudaError_t e = allow_dynamic_smem<kKernel>(smem);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(rows / kFp32BwdBlock), static_cast<unsigned>(heads),
                  static_cast<unsigned>(p.fwd.batch));
  kKernel<<<grid, kFp32BwdThreads, smem, stream>>>(p, planes);
  return cudaGetLastError();
}

// The dK/dV kernel (blocks over the keys; none without keys: then dk, dv are empty) and the dQ
// kernel (blocks over the queries; with no key, dq is written as zeros) on written planes.
template <typename Policy>
cudaError_t launch_backward_fp32_dkdv(const BackwardParams& p, const Fp32BackwardPlanes& planes,
                                      cudaStream_t stream) {
  return launch_fp32_backward_kernel<&backward_dkdv_fp32_kernel<Policy>>(
      fp32_bwd_smem_bytes(true), planes.k_rows, p.fwd.heads / p.fwd.kv_group, p, planes, stream);
}
template <typename Policy>
cudaError_t launch_backward_fp32_dq(const BackwardParams& p, const Fp32BackwardPlanes& planes,
                                    cudaStream_t stream) {
  return launch_fp32_backward_kernel<&backward_dq_fp32_kernel<Policy>>(
      fp32_bwd_smem_bytes(false), planes.q_rows, p.fwd.heads, p, planes, stream);
}

template <typename T, int kD, typename Policy>
Status launch_backward_fp32(const BackwardParams& p, cudaStream_t stream) {
  static_assert(std::is_same_v<T, float> && kD == kFp32PlaneWidth, "fp32, head dims up to 64");
  auto fail = [](const char* what, cudaError_t e) {
    return Status::backend_error(std::string("fmha: CUDA backward kernels (sm90 fp32): ") + what +
                                 ": " + cudaGetErrorString(e));
  };
  // The planes in the call's scratch memory (backward.cu's plan).
  if (p.fwd.scratch == nullptr) {
    return Status::backend_error(
        "fmha: CUDA backward kernels (sm90 fp32): no scratch memory for their operand planes (an "
        "internal error: the call's workspace plan missed them)");
  }
  Fp32BackwardPlanes planes;
  cudaError_t e = write_backward_planes(p, static_cast<float*>(p.fwd.scratch), &planes, stream);
  if (e == cudaSuccess) e = launch_backward_fp32_dkdv<Policy>(p, planes, stream);
  if (e == cudaSuccess) e = launch_backward_fp32_dq<Policy>(p, planes, stream);
  if (e != cudaSuccess) return fail("launch failed", e);
  return Status::ok_status();
}

}  // namespace fmha::cuda::sm90
