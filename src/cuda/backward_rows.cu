// Row-wise kernels around the backward's main kernels: the preprocess (Delta, lse in log2 units,
// sink terms; its threads also zero the workspace's accumulators), the ordered dsinks reduction,
// the conversion of the fused dQ accumulator and of the bias / rel-pos gradients' accumulators.
// Rows are addressed as [outer, H, inner] (dense: B x Lq; varlen: 1 x total_q, batch strides 0),
// so none of them needs cu_seqlens. One warp per row; lanes stride over the head dim.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/common/online_softmax.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/dispatch_bwd.h"

namespace fmha::cuda {
namespace {

constexpr int kRowWarps = 8;  // rows per block
constexpr int kRowThreads = kRowWarps * 32;
constexpr int kReduceThreads = 256;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Row i's statistics from dot = dot(dout[i], out[i]): Delta, lse in log2 units and the sink term.
__device__ __forceinline__ void store_row_statistics(const BackwardParams& p, std::int64_t b,
                                                     std::int64_t h, std::int64_t i, float dot) {
  const ForwardParams& f = p.fwd;
  if (p.dlse != nullptr) {
    dot -= p.dlse[b * p.dlse_batch_stride + h * p.dlse_head_stride + i * p.dlse_row_stride];
  }
  const float lse = f.lse[b * f.lse_batch_stride + h * f.lse_head_stride + i * f.lse_row_stride];
  const std::int64_t stat = b * p.stat_batch_stride + h * p.stat_head_stride + i;
  // A row with lse = -inf saw nothing (no key, no sink): +inf makes every P of it exactly 0.
  const bool empty = lse == -INFINITY;
  p.delta[stat] = dot;
  p.lse_log2[stat] = empty ? INFINITY : lse * kLog2e;
  if (p.sink_term != nullptr) {
    const float p_sink = empty ? 0.0f : expf(f.sinks[h * f.sinks_stride] - lse);
    p.sink_term[stat] = p_sink * dot;
  }
}

// A padding row past the queries (BackwardParams::stat_rows): P = exp2(s - lse_log2) = 0 there.
__device__ __forceinline__ void store_padding_statistics(const BackwardParams& p, std::int64_t b,
                                                         std::int64_t h, std::int64_t i) {
  const std::int64_t stat = b * p.stat_batch_stride + h * p.stat_head_stride + i;
  p.delta[stat] = 0.0f;
  p.lse_log2[stat] = INFINITY;
}

// The preprocess grid's share of the workspace zeroing (ZeroedWorkspace): consecutive threads of
// the whole grid store consecutive 16-byte vectors, striding by the grid's threads.
__device__ __forceinline__ void zero_workspace(const ZeroedWorkspace& zeroed) {
  const std::int64_t block =
      (static_cast<std::int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const std::int64_t threads =
      static_cast<std::int64_t>(gridDim.x) * gridDim.y * gridDim.z * kRowThreads;
  for (std::int64_t v = block * kRowThreads + threadIdx.x; v < zeroed.vectors; v += threads) {
    zeroed.base[v] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// Any layout: one warp per row, lanes striding over the elements. grid (ceil(rows / kRowWarps),
// H, outer), rows = max(inner, p.stat_rows).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    backward_preprocess_kernel(const __grid_constant__ BackwardParams p, std::int64_t inner,
                               const ZeroedWorkspace zeroed) {
  zero_workspace(zeroed);
  const ForwardParams& f = p.fwd;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  if (i >= inner) {
    if (i < p.stat_rows && lane == 0) store_padding_statistics(p, b, h, i);
    return;
  }
  using Elem = typename tile::Dtype<T>::Storage;
  const auto* dout = static_cast<const Elem*>(p.dout) + b * p.dout_batch_stride +
                     i * p.dout_row_stride + h * p.dout_head_stride;
  const auto* out = static_cast<const Elem*>(f.out) + b * f.out_batch_stride +
                    i * f.out_row_stride + h * f.out_head_stride;
  float dot = 0.0f;
  for (int c = lane; c < f.value_dim; c += 32) {
    dot += tile::Dtype<T>::to_float(dout[c]) * tile::Dtype<T>::to_float(out[c]);
  }
  dot = warp_sum(dot);
  if (lane == 0) store_row_statistics(p, b, h, i, dot);
}

// Rows of 16-byte chunks (p.preprocess_chunks): kGroup lanes per row, 32 / kGroup rows a
// warp, one 16-byte load of dout and of out per lane and chunk. The one-warp-a-row kernel spent
// most of its time waiting on one round of 2-byte loads per warp (SAM-B, H200: 0.136 ms for
// 100 MB, about 0.74 TB/s). grid (ceil(inner / (kRowWarps * 32 / kGroup)), H, outer).
template <typename T, int kGroup>
__global__ void __launch_bounds__(kRowThreads)
    backward_preprocess_chunks_kernel(const __grid_constant__ BackwardParams p,
                                      std::int64_t inner, const ZeroedWorkspace zeroed) {
  zero_workspace(zeroed);
  using Elem = typename tile::Dtype<T>::Storage;
  constexpr int kPerChunk = 16 / static_cast<int>(sizeof(Elem));
  constexpr int kRowsPerWarp = 32 / kGroup;
  const ForwardParams& f = p.fwd;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t i =
      (static_cast<std::int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32) * kRowsPerWarp +
      lane / kGroup;
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  const bool exists = i < inner;  // every lane takes part in the shuffles below
  const auto* dout = static_cast<const Elem*>(p.dout) + b * p.dout_batch_stride +
                     i * p.dout_row_stride + h * p.dout_head_stride;
  const auto* out = static_cast<const Elem*>(f.out) + b * f.out_batch_stride +
                    i * f.out_row_stride + h * f.out_head_stride;
  const int chunks = exists ? f.value_dim / kPerChunk : 0;
  float dot = 0.0f;
  for (int c = lane % kGroup; c < chunks; c += kGroup) {
    const uint4 x = __ldg(reinterpret_cast<const uint4*>(dout + c * kPerChunk));
    const uint4 y = __ldg(reinterpret_cast<const uint4*>(out + c * kPerChunk));
    const Elem* xe = reinterpret_cast<const Elem*>(&x);
    const Elem* ye = reinterpret_cast<const Elem*>(&y);
#pragma unroll
    for (int e = 0; e < kPerChunk; ++e) {
      dot += tile::Dtype<T>::to_float(xe[e]) * tile::Dtype<T>::to_float(ye[e]);
    }
  }
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset /= 2) {
    dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  }
  if (exists && lane % kGroup == 0) store_row_statistics(p, b, h, i, dot);
  if (!exists && i < p.stat_rows && lane % kGroup == 0) store_padding_statistics(p, b, h, i);
}

// One block per head; a fixed assignment of rows to threads and a fixed tree, so the sum is the
// same bits on every run.
__global__ void __launch_bounds__(kReduceThreads)
    backward_dsinks_kernel(const __grid_constant__ BackwardParams p, std::int64_t outer,
                           std::int64_t inner) {
  __shared__ float partial[kReduceThreads];
  const std::int64_t h = blockIdx.x;
  float sum = 0.0f;
  for (std::int64_t n = threadIdx.x; n < outer * inner; n += kReduceThreads) {
    const std::int64_t b = n / inner, i = n % inner;
    sum += p.sink_term[b * p.stat_batch_stride + h * p.stat_head_stride + i];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kReduceThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float* const dsink = p.dsinks + h * p.dsinks_stride;
    *dsink = (p.accumulate_dsinks ? *dsink : 0.0f) - partial[0];
  }
}

// grid (ceil(inner / kRowWarps), H, outer).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    backward_convert_dq_kernel(const __grid_constant__ BackwardParams p, std::int64_t inner) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  if (i >= inner) return;
  const float* accum =
      p.dq_accum + b * p.accum_batch_stride + h * p.accum_head_stride + i * p.accum_row_stride;
  auto* dq = static_cast<typename tile::Dtype<T>::Storage*>(p.dq) + b * p.dq_batch_stride +
             i * p.dq_row_stride + h * p.dq_head_stride;
  for (int c = lane; c < p.fwd.head_dim; c += 32) {
    dq[c] = tile::Dtype<T>::from_float(accum[c] * p.scale);
  }
}

// The sm90 fused kernel's accumulator, by column ([head_dim][queries] per head, columns
// accum_col_stride apart): a block transposes 32 rows x 32 columns at a time through shared memory,
// reading and writing 32 consecutive elements a warp. grid (ceil(inner / 32), H, outer).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    backward_convert_dq_by_column_kernel(const __grid_constant__ BackwardParams p,
                                         std::int64_t inner) {
  __shared__ float tile[32][33];  // [column][row], padded against bank conflicts
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.x) * 32;
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const float* accum = p.dq_accum + b * p.accum_batch_stride + h * p.accum_head_stride + i0;
  auto* dq = static_cast<typename tile::Dtype<T>::Storage*>(p.dq) + b * p.dq_batch_stride +
             i0 * p.dq_row_stride + h * p.dq_head_stride;
  const int rows = static_cast<int>(inner - i0 < 32 ? inner - i0 : 32);
  for (int c0 = 0; c0 < p.fwd.head_dim; c0 += 32) {
    for (int c = warp; c < 32; c += kRowWarps) {
      if (c0 + c < p.fwd.head_dim && lane < rows) {
        tile[c][lane] = accum[(c0 + c) * p.accum_col_stride + lane];
      }
    }
    __syncthreads();
    for (int r = warp; r < rows; r += kRowWarps) {
      if (c0 + lane < p.fwd.head_dim) {
        dq[r * p.dq_row_stride + c0 + lane] = tile::Dtype<T>::from_float(tile[lane][r] * p.scale);
      }
    }
    __syncthreads();
  }
}

// A compact fp32 accumulator [sizes] -> a 4-D gradient with its own strides (src null: zeros, a
// sum over no rows): one warp per row of the last dimension (grid-stride over the rows), lanes
// along it; a row's offset takes two divisions (32-bit where the row count allows), where one per
// element took four 64-bit ones (0.3 ms of the SAM-B backward for drel_h / drel_w, Nsight Systems
// via torch.profiler).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    backward_convert_4d_kernel(const float* src, Extents4 sizes, void* dst, Extents4 stride,
                               std::int64_t rows) {
  auto* out = static_cast<typename tile::Dtype<T>::Storage*>(dst);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t width = sizes.v[3];
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
       row < rows; row += static_cast<std::int64_t>(gridDim.x) * kRowWarps) {
    std::int64_t i0, i1, i2;
    if (rows <= INT32_MAX) {
      const auto r = static_cast<std::uint32_t>(row);
      const auto s1 = static_cast<std::uint32_t>(sizes.v[1]);
      const auto s2 = static_cast<std::uint32_t>(sizes.v[2]);
      i2 = r % s2;
      i1 = r / s2 % s1;
      i0 = r / s2 / s1;
    } else {
      i2 = row % sizes.v[2];
      i1 = row / sizes.v[2] % sizes.v[1];
      i0 = row / sizes.v[2] / sizes.v[1];
    }
    auto* const dst_row = out + i0 * stride.v[0] + i1 * stride.v[1] + i2 * stride.v[2];
    const float* const src_row = src != nullptr ? src + row * width : nullptr;
    for (std::int64_t c = lane; c < width; c += 32) {
      dst_row[c * stride.v[3]] = tile::Dtype<T>::from_float(src_row != nullptr ? src_row[c] : 0.0f);
    }
  }
}

Status launched(const char* name) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::ok_status();
  return Status::backend_error(std::string("fmha: CUDA ") + name +
                               " kernel launch failed: " + cudaGetErrorString(e));
}

dim3 row_grid(const BackwardParams& p, std::int64_t outer, std::int64_t inner) {
  return dim3(static_cast<unsigned>((inner + kRowWarps - 1) / kRowWarps),
              static_cast<unsigned>(p.fwd.heads), static_cast<unsigned>(outer));
}

}  // namespace

Status launch_backward_convert_4d(const float* src, const Extents4& sizes, void* dst,
                                  const Extents4& dst_stride, DType dtype, cudaStream_t stream) {
  const std::int64_t rows = sizes.v[0] * sizes.v[1] * sizes.v[2];
  if (rows == 0 || sizes.v[3] == 0) return Status::ok_status();
  constexpr std::int64_t kMaxBlocks = 4096;  // grid-stride beyond
  const std::int64_t blocks =
      std::min<std::int64_t>((rows + kRowWarps - 1) / kRowWarps, kMaxBlocks);
  if (dtype == DType::kFloat16) {
    backward_convert_4d_kernel<__half><<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(
        src, sizes, dst, dst_stride, rows);
  } else if (dtype == DType::kFloat32) {
    backward_convert_4d_kernel<float><<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(
        src, sizes, dst, dst_stride, rows);
  } else {
    backward_convert_4d_kernel<__nv_bfloat16>
        <<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(src, sizes, dst, dst_stride,
                                                                    rows);
  }
  return launched("backward gradient conversion");
}

namespace {

// The chunk kernel with kGroup lanes a row: the power of two that covers a row's chunks, 4 to 32
// (longer rows loop).
template <typename T>
void launch_preprocess_chunks(const BackwardParams& p, std::int64_t outer, std::int64_t inner,
                              const ZeroedWorkspace& zeroed, cudaStream_t stream) {
  const int chunks = p.fwd.value_dim * static_cast<int>(sizeof(T)) / 16;
  const std::int64_t rows = std::max(inner, p.stat_rows);
  auto launch = [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    constexpr std::int64_t kRowsPerBlock = kRowWarps * 32 / kGroup;
    const dim3 grid(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                    static_cast<unsigned>(p.fwd.heads), static_cast<unsigned>(outer));
    backward_preprocess_chunks_kernel<T, kGroup>
        <<<grid, kRowThreads, 0, stream>>>(p, inner, zeroed);
  };
  if (chunks <= 4) {
    launch(std::integral_constant<int, 4>{});
  } else if (chunks <= 8) {
    launch(std::integral_constant<int, 8>{});
  } else if (chunks <= 16) {
    launch(std::integral_constant<int, 16>{});
  } else {
    launch(std::integral_constant<int, 32>{});
  }
}

template <typename T>
void launch_preprocess(const BackwardParams& p, std::int64_t outer, std::int64_t inner,
                       const ZeroedWorkspace& zeroed, cudaStream_t stream) {
  if (p.preprocess_chunks) {
    launch_preprocess_chunks<T>(p, outer, inner, zeroed, stream);
  } else {
    backward_preprocess_kernel<T>
        <<<row_grid(p, outer, std::max(inner, p.stat_rows)), kRowThreads, 0, stream>>>(p, inner,
                                                                                       zeroed);
  }
}

}  // namespace

Status launch_backward_preprocess(const BackwardParams& p, DType dtype, std::int64_t outer,
                                  std::int64_t inner, const ZeroedWorkspace& zeroed,
                                  cudaStream_t stream) {
  if (outer == 0 || inner == 0 || p.fwd.heads == 0) {
    // No rows (Lq = 0): a dbias broadcast over the queries still sums nothing into zeros.
    if (zeroed.vectors == 0) return Status::ok_status();
    const cudaError_t e = cudaMemsetAsync(
        zeroed.base, 0, static_cast<std::size_t>(zeroed.vectors) * sizeof(float4), stream);
    if (e == cudaSuccess) return Status::ok_status();
    return Status::backend_error(
        std::string("fmha: cudaMemsetAsync of the backward's accumulators failed: ") +
        cudaGetErrorString(e));
  }
  if (dtype == DType::kFloat16) {
    launch_preprocess<__half>(p, outer, inner, zeroed, stream);
  } else if (dtype == DType::kFloat32) {
    launch_preprocess<float>(p, outer, inner, zeroed, stream);
  } else {
    launch_preprocess<__nv_bfloat16>(p, outer, inner, zeroed, stream);
  }
  return launched("backward preprocess");
}

Status launch_backward_dsinks(const BackwardParams& p, std::int64_t outer, std::int64_t inner,
                              cudaStream_t stream) {
  if (p.fwd.heads == 0) return Status::ok_status();
  backward_dsinks_kernel<<<static_cast<unsigned>(p.fwd.heads), kReduceThreads, 0, stream>>>(
      p, outer, inner);
  return launched("backward dsinks");
}

Status launch_backward_convert_dq(const BackwardParams& p, DType dtype, std::int64_t outer,
                                  std::int64_t inner, cudaStream_t stream) {
  if (outer == 0 || inner == 0 || p.fwd.heads == 0) return Status::ok_status();
  if (p.accum_col_stride != 1) {  // the sm90 fused kernel's layout (16-bit types only)
    const dim3 grid(static_cast<unsigned>((inner + 31) / 32), static_cast<unsigned>(p.fwd.heads),
                    static_cast<unsigned>(outer));
    if (dtype == DType::kFloat16) {
      backward_convert_dq_by_column_kernel<__half><<<grid, kRowThreads, 0, stream>>>(p, inner);
    } else {
      backward_convert_dq_by_column_kernel<__nv_bfloat16>
          <<<grid, kRowThreads, 0, stream>>>(p, inner);
    }
    return launched("backward dQ conversion");
  }
  const dim3 grid = row_grid(p, outer, inner);
  if (dtype == DType::kFloat16) {
    backward_convert_dq_kernel<__half><<<grid, kRowThreads, 0, stream>>>(p, inner);
  } else if (dtype == DType::kFloat32) {
    backward_convert_dq_kernel<float><<<grid, kRowThreads, 0, stream>>>(p, inner);
  } else {
    backward_convert_dq_kernel<__nv_bfloat16><<<grid, kRowThreads, 0, stream>>>(p, inner);
  }
  return launched("backward dQ conversion");
}

}  // namespace fmha::cuda
