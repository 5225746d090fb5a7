// Which (batch, tile) of the grid a block owns. The grid is (tiles, heads, batch), or, with
// ForwardParams::batch_innermost, (tiles * batch, heads, 1) with the batch varying fastest: the
// blocks that read the same tile of a bias shared by every batch ([1, H, L, L]) then run at the
// same time and find it in L2, instead of reading it from memory once per batch. The sm90
// backward kernels use it (H100, SAM-B [1, H, L, L] bias: dbias backward 79 -> 117 TFLOP/s, its
// atomic sums over the batch then meet in L2; a fixed bias 177 -> 181), and the forward's
// register-form bias (PolicyBias), for its memory traffic: SAM-B forward 1.55 ms either way on
// an H100, where the batch outermost reads the bias from memory 8 times; not the forward's general
// policy (the decoding cost it 80 bytes more spill at D 128).
#pragma once

#include <cstdint>

#include "cuda/common/forward_params.h"

namespace fmha::cuda {

struct BlockCoords {
  std::int64_t batch, tile, tiles;  // tile in [0, tiles)
};

__device__ __forceinline__ BlockCoords block_coords(const ForwardParams& f) {
  if (!f.batch_innermost) return {blockIdx.z, blockIdx.x, gridDim.x};
  const unsigned batch = static_cast<unsigned>(f.batch);  // a grid dimension's worth at most
  return {blockIdx.x % batch, blockIdx.x / batch, gridDim.x / batch};
}

// The grid of `tiles` x `heads` blocks a batch, in the order block_coords reads.
inline dim3 batch_grid(const ForwardParams& f, std::int64_t tiles, std::int64_t heads) {
  if (f.batch_innermost) {
    return dim3(static_cast<unsigned>(tiles * f.batch), static_cast<unsigned>(heads), 1);
  }
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(heads),
              static_cast<unsigned>(f.batch));
}

// Whether the bias is one for every batch of a dense batch (the case batch_innermost is for).
inline bool bias_shared_by_batches(const ForwardParams& f) {
  return f.bias != nullptr && f.bias_stride[0] == 0 && f.batch > 1 && f.cu_seqlens_q == nullptr;
}

}  // namespace fmha::cuda
