// Definition of sm90::launch_forward_fp32; included only by its instantiation file.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/common/kernel_attributes.h"
#include "cuda/sm90/fp32_planes.cuh"
#include "cuda/sm90/launch_fwd_fp32.h"
#include "cuda/sm90/mainloop_fwd_fp32.cuh"

namespace fmha::cuda::sm90 {

template <typename T, int kD, typename Policy>
Status launch_forward_fp32(const ForwardParams& p, cudaStream_t stream) {
  static_assert(std::is_same_v<T, float> && kD == kFp32PlaneWidth, "fp32, head dims up to 64");
  const int kv_heads = p.heads / p.kv_group;
  Fp32Planes planes;
  planes.q_rows = round_up(p.seqlen_q, kFp32QueryTile);
  planes.k_rows = round_up(p.seqlen_k, kFp32KeyTile);
  // The planes in the call's scratch memory (forward.cu sized it by fp32_forward_planes_floats).
  const PlaneFloats floats = forward_plane_floats(p);
  if (p.scratch == nullptr) {
    return Status::backend_error(
        "fmha: CUDA forward kernel (sm90 fp32): no scratch memory for its operand planes (an "
        "internal error: the call's workspace plan missed them)");
  }
  auto fail = [](const char* what, cudaError_t e) {
    return Status::backend_error(std::string("fmha: CUDA forward kernel (sm90 fp32): ") + what +
                                 ": " + cudaGetErrorString(e));
  };
  float* q = static_cast<float*>(p.scratch);
  float* k = q + floats.q;
  float* vt = k + floats.k;
  planes.q = q;
  planes.k = k;
  planes.vt = vt;
  cudaError_t e = split_planes(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.batch, p.heads,
                   p.seqlen_q, p.head_dim, q, nullptr, planes.q_rows, stream);
  if (e == cudaSuccess) {
    e = split_planes(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, p.batch, kv_heads,
                     p.seqlen_k, p.head_dim, k, nullptr, planes.k_rows, stream);
  }
  if (e == cudaSuccess) {
    e = split_planes(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, p.batch, kv_heads,
                     p.seqlen_k, p.value_dim, nullptr, vt, planes.k_rows, stream);
  }
  if (e == cudaSuccess) {
    constexpr int smem = fp32_forward_smem_bytes();
    constexpr auto* kernel = &forward_fp32_kernel<Policy>;
    e = allow_dynamic_smem<kernel>(smem);
    if (e == cudaSuccess) {
      const dim3 grid(static_cast<unsigned>(planes.q_rows / kFp32QueryTile),
                      static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
      kernel<<<grid, kFp32Threads, smem, stream>>>(p, planes);
      e = cudaGetLastError();
    }
  }
  if (e != cudaSuccess) return fail("launch failed", e);
  return Status::ok_status();
}

}  // namespace fmha::cuda::sm90
