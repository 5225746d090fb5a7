// The operands of the sm90 fp32 kernels, prepared once per call ("planes"): each fp32 input split
// into tf32 hi and lo parts (SPEC §13's exact mode, 3xTF32: x = hi + lo, hi the nearest tf32,
// tile_operands.cuh) and laid out as the tf32 wgmma reads them.
//
// tf32 wgmma reads both shared-memory operands K-major only (wgmma_ops.cuh), so an operand whose
// contraction runs along the sequence (V in P V) needs a transposed copy; and its A operand from
// registers, P, comes straight from the S accumulators only with the keys of each 8-key step in
// the order the accumulator holds them (slot c <- key 2c, slot c + 4 <- key 2c + 1, as the sm80
// fp32 kernels do in registers). Writing the planes in a pass of their own makes both free for the
// kernel: no split and no transpose in its loop, tiles that are whole (rows past the sequence are
// zeros) and copies of 16-byte chunks. The price is the pass (every input read once, twice its
// size written) and the planes' memory, 2x (Q, K) and 2x (V) the inputs, O(L), freed after the call.
//
// Layouts, per (batch, head) of the input (kv heads for K and V), rows padded to whole tiles:
//   q, k  [rows, 128]:  row r = hi of the head dim (64 floats, zero past D) | lo (64 floats)
//   vt    [128, rows]:  rows 0-63 hi of value column c, 64-127 lo; keys permuted within each 8
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/tile_operands.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm90/fp32_plane_sizes.h"

namespace fmha::cuda::sm90 {

inline constexpr int kFp32PlaneTile = 64;  // rows a block of the pass covers

struct Fp32Planes {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* vt = nullptr;
  std::int64_t q_rows = 0;  // Lq padded (a multiple of the kernel's query tile)
  std::int64_t k_rows = 0;  // Lk padded (a multiple of the kernel's key tile)
};

// Key of slot s of an 8-key step in the permuted order (the inverse of the accumulator's pairs).
__host__ __device__ constexpr int permuted_key(int slot) { return slot < 4 ? 2 * slot : 2 * slot - 7; }

// One block: kTile rows of one (batch, head) of `src` ([B, L, H, cols], any strides), read once,
// into the row plane `rows_dst` and the transposed plane `cols_dst` (either may be null) of
// padded_rows rows; grid (padded_rows / kTile, heads, batch).
template <int kTile>
__global__ void __launch_bounds__(256) split_fp32_planes(const float* __restrict__ src,
                                                         std::int64_t batch_stride,
                                                         std::int64_t row_stride,
                                                         std::int64_t head_stride, std::int64_t rows,
                                                         int cols, float* __restrict__ rows_dst,
                                                         float* __restrict__ cols_dst,
                                                         std::int64_t padded_rows) {
  constexpr int kWidth = kFp32PlaneWidth;
  static_assert(kTile % 8 == 0, "whole 8-row groups (the transposed plane's permutation)");
  __shared__ float tile[kTile][kWidth + 1];  // +1: the transposed reads hit 32 banks
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  const float* in = src + blockIdx.z * batch_stride + blockIdx.y * head_stride;
  for (int i = threadIdx.x; i < kTile * kWidth; i += blockDim.x) {
    const int r = i / kWidth, c = i % kWidth;
    const std::int64_t row = row0 + r;
    tile[r][c] = row < rows && c < cols ? in[row * row_stride + c] : 0.0f;
  }
  __syncthreads();
  const std::int64_t plane = static_cast<std::int64_t>(blockIdx.z) * gridDim.y + blockIdx.y;
  auto write = [&](float* hi_at, float* lo_at, float x) {
    const std::uint32_t hi = tile::round_to_tf32(__float_as_uint(x));
    *hi_at = __uint_as_float(hi);
    *lo_at = x - __uint_as_float(hi);
  };
  if (rows_dst != nullptr) {
    float* out = rows_dst + (plane * padded_rows + row0) * kFp32PlaneRowFloats;
    for (int i = threadIdx.x; i < kTile * kWidth; i += blockDim.x) {
      const int r = i / kWidth, c = i % kWidth;
      float* row = out + r * kFp32PlaneRowFloats;
      write(row + c, row + kWidth + c, tile[r][c]);
    }
  }
  if (cols_dst != nullptr) {
    float* out = cols_dst + plane * kFp32PlaneRowFloats * padded_rows + row0;
    for (int i = threadIdx.x; i < kTile * kWidth; i += blockDim.x) {
      const int c = i / kTile, slot = i % kTile;
      const int key = (slot & ~7) | permuted_key(slot & 7);
      write(out + c * padded_rows + slot, out + (kWidth + c) * padded_rows + slot, tile[key][c]);
    }
  }
}

// Runs the pass over one input, [batch, rows, heads, cols] at the given strides, into the planes
// given (row plane, transposed plane; null: not wanted).
inline cudaError_t split_planes(const void* src, std::int64_t batch_stride,
                                std::int64_t row_stride, std::int64_t head_stride,
                                std::int64_t batch, std::int64_t heads, std::int64_t rows, int cols,
                                float* rows_dst, float* cols_dst, std::int64_t padded_rows,
                                cudaStream_t stream) {
  if (padded_rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(padded_rows / kFp32PlaneTile), static_cast<unsigned>(heads),
                  static_cast<unsigned>(batch));
  split_fp32_planes<kFp32PlaneTile><<<grid, 256, 0, stream>>>(static_cast<const float*>(src), batch_stride,
                                                              row_stride, head_stride, rows, cols,
                                                              rows_dst, cols_dst, padded_rows);
  return cudaGetLastError();
}

// The thread's warpgroup, as a value the compiler knows to be the same across the warp (read from
// lane 0): the wgmma descriptors made from it then live in uniform registers, not moved there
// before every product (R2UR).
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
}

// x as a tf32 pair in registers: hi the nearest tf32, lo the rest (the pass's split, one value).
__device__ __forceinline__ void split_tf32(float x, std::uint32_t& hi, std::uint32_t& lo) {
  hi = tile::round_to_tf32(__float_as_uint(x));
  lo = __float_as_uint(x - __uint_as_float(hi));
}

// Copies rows [0, kRows) x 16-byte chunks [0, kChunks) of a plane (row pitch in floats) into
// `Tile` at `smem`: the share of thread `thread` of kThreads, by cp.async. A thread keeps one
// chunk column and steps down the rows (addresses by increments, not per-chunk products).
template <typename Tile, int kRows, int kChunks, int kThreads>
__device__ __forceinline__ void copy_plane_tile(std::uint32_t smem, const float* src,
                                                std::int64_t pitch, int thread) {
  static_assert(kThreads % kChunks == 0 && kRows % (kThreads / kChunks) == 0,
                "whole rows a round");
  constexpr int kRowStep = kThreads / kChunks;
  const int r0 = static_cast<int>(static_cast<unsigned>(thread) / kChunks);
  const int c = static_cast<int>(static_cast<unsigned>(thread) % kChunks);
  const float* from = src + r0 * pitch + c * 4;
#pragma unroll
  for (int n = 0; n < kRows / kRowStep; ++n) {
    tile::cp_async_16(smem + Tile::chunk_offset(r0 + n * kRowStep, c), from, 16);
    from += kRowStep * pitch;
  }
}

}  // namespace fmha::cuda::sm90
