// Merging partial attentions on CUDA (SPEC §12), forward and backward.
//
// Each part n of a row (b, h, i) brings out_n [Dv] and lse_n; with lse = logaddexp over the parts
// and weights w_n = exp(lse_n - lse) (0 for -inf parts, all 0 when every part is -inf):
//   forward:  out = sum_n w_n out_n
//   backward: dout_n = w_n dout,  dlse_n = w_n (dout . out_n - dout . out + dlse)
// where dout . out = sum_n w_n (dout . out_n) is recomputed from the parts, as the reference does,
// so the merged out and lse are never read. A part of weight 0 is never read either: its out may
// hold anything (even NaN) without reaching the result.
//
// One warp per row: the lanes stride over Dv (coalesced along the row) and each computes the
// weights itself from the parts' lse (broadcast loads), so no lane waits on another but in the dot
// products' reductions. Blocks of 4 warps take consecutive rows; a grid-stride loop covers any row
// count. The parts travel in the __grid_constant__ kernel argument, at most kMaxParts of them, so
// weights and dot products stay in registers (loops over parts are unrolled to kMaxParts).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/backend.h"
#include "cuda/device_guard.h"

namespace fmha::cuda {
namespace {

// 16 parts keep the backward's argument (4 tensors a part) at 2 KB, within the 4 KB that every
// CUDA 12 driver takes, and its per-part registers (weight, dot product) at 32.
constexpr int kMaxParts = 16;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// Enough blocks to fill any GPU many times over; rows beyond are covered by the grid-stride loop.
constexpr std::int64_t kMaxBlocks = std::int64_t{1} << 20;

// A tensor of rows: out-like [B, Lq, H, Dv] (strides of b, i, h; Dv has stride 1) or lse-like
// [B, H, Lq] (strides of b, h, i).
struct RowTensor {
  void* data = nullptr;
  std::int64_t stride[3] = {0, 0, 0};
};

struct MergeSizes {
  std::int64_t batch = 0, rows = 0, heads = 0, value_dim = 0;
};

struct MergeForwardArgs {
  int num_parts = 0;
  RowTensor outs[kMaxParts], lses[kMaxParts];
  RowTensor out, lse;
  MergeSizes sizes;
};

struct MergeBackwardArgs {
  int num_parts = 0;
  RowTensor outs[kMaxParts], lses[kMaxParts], douts[kMaxParts], dlses[kMaxParts];
  RowTensor dout, dlse;  // dlse.data is nullptr when not given
  MergeSizes sizes;
};

static_assert(sizeof(MergeBackwardArgs) <= 4096, "kernel arguments are limited to 4 KB");

template <typename T>
struct Element;
template <>
struct Element<float> {
  __device__ static float load(const float* p) { return *p; }
  __device__ static float store_value(float x) { return x; }
};
template <>
struct Element<__half> {
  __device__ static float load(const __half* p) { return __half2float(*p); }
  __device__ static __half store_value(float x) { return __float2half_rn(x); }
};
template <>
struct Element<__nv_bfloat16> {
  __device__ static float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  __device__ static __nv_bfloat16 store_value(float x) { return __float2bfloat16_rn(x); }
};

struct Row {
  std::int64_t b, h, i;
};

__device__ __forceinline__ Row row_of(const MergeSizes& s, std::int64_t index) {
  const std::int64_t i = index % s.rows;
  const std::int64_t bh = index / s.rows;
  return {bh / s.heads, bh % s.heads, i};
}

// Element (row, 0) of an out-like tensor.
template <typename T>
__device__ __forceinline__ T* out_row(const RowTensor& t, const Row& r) {
  return static_cast<T*>(t.data) + r.b * t.stride[0] + r.i * t.stride[1] + r.h * t.stride[2];
}
__device__ __forceinline__ float* lse_at(const RowTensor& t, const Row& r) {
  return static_cast<float*>(t.data) + r.b * t.stride[0] + r.h * t.stride[1] + r.i * t.stride[2];
}

// The merged lse of a row and each part's weight (parts past num_parts weigh 0). Every -inf part
// weighs exactly 0; when all parts are -inf the lse is -inf and every weight 0, never NaN.
__device__ __forceinline__ float merge_weights(const RowTensor (&lses)[kMaxParts], int num_parts,
                                               const Row& r, float (&w)[kMaxParts]) {
  float row_max = -INFINITY;
#pragma unroll
  for (int n = 0; n < kMaxParts; ++n) {
    w[n] = n < num_parts ? *lse_at(lses[n], r) : -INFINITY;  // lse_n, for now
    row_max = fmaxf(row_max, w[n]);
  }
  if (row_max == -INFINITY) {
#pragma unroll
    for (int n = 0; n < kMaxParts; ++n) w[n] = 0.0f;
    return -INFINITY;
  }
  float sum = 0.0f;
#pragma unroll
  for (int n = 0; n < kMaxParts; ++n) sum += expf(w[n] - row_max);  // exp(-inf) = 0
  const float lse = row_max + logf(sum);
#pragma unroll
  for (int n = 0; n < kMaxParts; ++n) w[n] = expf(w[n] - lse);
  return lse;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    merge_forward_kernel(const __grid_constant__ MergeForwardArgs a) {
  using E = Element<T>;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t total = a.sizes.batch * a.sizes.heads * a.sizes.rows;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  for (std::int64_t index = first; index < total;
       index += static_cast<std::int64_t>(gridDim.x) * kWarps) {
    const Row r = row_of(a.sizes, index);
    float w[kMaxParts];
    const float lse = merge_weights(a.lses, a.num_parts, r, w);
    T* const out = out_row<T>(a.out, r);
    for (std::int64_t d = lane; d < a.sizes.value_dim; d += 32) {
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kMaxParts; ++n) {
        if (w[n] != 0.0f) sum += w[n] * E::load(out_row<const T>(a.outs[n], r) + d);
      }
      out[d] = E::store_value(sum);
    }
    if (lane == 0) *lse_at(a.lse, r) = lse;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    merge_backward_kernel(const __grid_constant__ MergeBackwardArgs a) {
  using E = Element<T>;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t total = a.sizes.batch * a.sizes.heads * a.sizes.rows;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  for (std::int64_t index = first; index < total;
       index += static_cast<std::int64_t>(gridDim.x) * kWarps) {
    const Row r = row_of(a.sizes, index);
    float w[kMaxParts];
    merge_weights(a.lses, a.num_parts, r, w);
    const T* const dout = out_row<const T>(a.dout, r);
    // dout . out_n for every part that weighs (the weights are the same in every lane, so the
    // branches and the shuffles inside them are warp-uniform).
    float dot[kMaxParts];
    float dout_dot_out = 0.0f;
#pragma unroll
    for (int n = 0; n < kMaxParts; ++n) {
      dot[n] = 0.0f;
      if (w[n] != 0.0f) {
        const T* const out_n = out_row<const T>(a.outs[n], r);
        float partial = 0.0f;
        for (std::int64_t d = lane; d < a.sizes.value_dim; d += 32) {
          partial += E::load(dout + d) * E::load(out_n + d);
        }
        dot[n] = warp_sum(partial);
        dout_dot_out += w[n] * dot[n];
      }
    }
    const float dlse = a.dlse.data != nullptr ? *lse_at(a.dlse, r) : 0.0f;
#pragma unroll
    for (int n = 0; n < kMaxParts; ++n) {
      if (n < a.num_parts) {
        T* const dout_n = out_row<T>(a.douts[n], r);
        for (std::int64_t d = lane; d < a.sizes.value_dim; d += 32) {
          dout_n[d] = E::store_value(w[n] * E::load(dout + d));
        }
        if (lane == 0) {
          *lse_at(a.dlses[n], r) = w[n] == 0.0f ? 0.0f : w[n] * (dot[n] - dout_dot_out + dlse);
        }
      }
    }
  }
}

RowTensor row_tensor(const TensorView& t) {
  RowTensor r;
  r.data = t.data;
  for (std::size_t d = 0; d < 3; ++d) r.stride[d] = t.stride[d];
  return r;
}

MergeSizes sizes_of(const TensorView& out) {
  return {out.shape[0], out.shape[1], out.shape[2], out.shape[3]};
}

Status check_parts(std::size_t parts) {
  if (parts <= static_cast<std::size_t>(kMaxParts)) return Status::ok_status();
  return Status::not_supported(
      "fmha: the CUDA merge kernel takes at most " + std::to_string(kMaxParts) +
      " parts per call; got " + std::to_string(parts) + ": merge groups of at most " +
      std::to_string(kMaxParts) +
      " parts, then merge the results (keep them in float32 to avoid rounding twice), or run on "
      "CPU tensors");
}

template <typename Args>
Status launch(const Args& args, DType dtype, int device, void* stream, void (*f32)(Args),
              void (*f16)(Args), void (*bf16)(Args)) {
  const MergeSizes& s = args.sizes;
  const std::int64_t total = s.batch * s.heads * s.rows;
  if (total == 0) return Status::ok_status();
  void (*kernel)(Args) = nullptr;
  switch (dtype) {
    case DType::kFloat32:
      kernel = f32;
      break;
    case DType::kFloat16:
      kernel = f16;
      break;
    case DType::kBFloat16:
      kernel = bf16;
      break;
    default:
      return Status::not_supported(std::string("fmha: the CUDA merge kernel got out of dtype ") +
                                   to_string(dtype) + " (supported: float32, float16, bfloat16)");
  }
  DeviceGuard guard;
  FMHA_RETURN_IF_ERROR(guard.enter(device));
  const std::int64_t wanted = (total + kWarps - 1) / kWarps;
  const auto blocks = static_cast<unsigned>(wanted < kMaxBlocks ? wanted : kMaxBlocks);
  kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    return Status::backend_error(std::string("fmha: CUDA merge kernel launch failed: ") +
                                 cudaGetErrorString(e));
  }
  return Status::ok_status();
}

}  // namespace

Status run(const MergeForwardParams& p, void* stream) {
  FMHA_RETURN_IF_ERROR(check_parts(p.outs.size()));
  MergeForwardArgs args;
  args.num_parts = static_cast<int>(p.outs.size());
  for (std::size_t n = 0; n < p.outs.size(); ++n) {
    args.outs[n] = row_tensor(p.outs[n]);
    args.lses[n] = row_tensor(p.lses[n]);
  }
  args.out = row_tensor(p.out);
  args.lse = row_tensor(p.lse);
  args.sizes = sizes_of(p.out);
  return launch(args, p.out.dtype, p.out.device.index, stream, &merge_forward_kernel<float>,
                &merge_forward_kernel<__half>, &merge_forward_kernel<__nv_bfloat16>);
}

Status run(const MergeBackwardParams& p, void* stream) {
  FMHA_RETURN_IF_ERROR(check_parts(p.outs.size()));
  MergeBackwardArgs args;
  args.num_parts = static_cast<int>(p.outs.size());
  for (std::size_t n = 0; n < p.outs.size(); ++n) {
    args.outs[n] = row_tensor(p.outs[n]);
    args.lses[n] = row_tensor(p.lses[n]);
    args.douts[n] = row_tensor(p.douts[n]);
    args.dlses[n] = row_tensor(p.dlses[n]);
  }
  args.dout = row_tensor(p.dout);
  if (p.dlse.defined()) args.dlse = row_tensor(p.dlse);
  args.sizes = sizes_of(p.dout);
  return launch(args, p.out.dtype, p.out.device.index, stream, &merge_backward_kernel<float>,
                &merge_backward_kernel<__half>, &merge_backward_kernel<__nv_bfloat16>);
}

}  // namespace fmha::cuda
