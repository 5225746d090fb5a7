// The exact (3xTF32) products of the sm90 fp32 kernels: per k-step of 32 bytes (8 floats) the three
// tf32 wgmma hi*hi + hi*lo + lo*hi of operands split into hi and lo parts (fp32_planes.cuh). Issued,
// not committed or waited for: the callers fence, commit and wait around them.
#pragma once

#include <cstdint>

#include "cuda/sm90/wgmma.cuh"
#include "cuda/sm90/wgmma_ops.cuh"

namespace fmha::cuda::sm90 {

// d = A B^T over kSteps k-steps, A and B both K-major plane tiles whose rows hold kSteps hi steps
// then kSteps lo steps (a plane row: hi | lo); a and b the descriptors of step 0.
template <typename ATile, typename BTile, int kSteps, int N>
__device__ __forceinline__ void issue_split_ss(float (&d)[N / 8][4], std::uint64_t a,
                                               std::uint64_t b) {
#pragma unroll
  for (int j = 0; j < kSteps; ++j) {
    Wgmma<float, N>::ss(d, a + ATile::k_step(j), b + BTile::k_step(j), j > 0);
    Wgmma<float, N>::ss(d, a + ATile::k_step(j), b + BTile::k_step(kSteps + j), 1);
    Wgmma<float, N>::ss(d, a + ATile::k_step(kSteps + j), b + BTile::k_step(j), 1);
  }
}

// d = A B^T over kSteps k-steps, A from registers (hi and lo tf32 fragments a step) and B a K-major
// tile whose hi and lo parts start at descriptors b_hi and b_lo.
template <typename BTile, int kSteps, int N>
__device__ __forceinline__ void issue_split_rs(float (&d)[N / 8][4],
                                               const std::uint32_t (&hi)[kSteps][4],
                                               const std::uint32_t (&lo)[kSteps][4],
                                               std::uint64_t b_hi, std::uint64_t b_lo) {
#pragma unroll
  for (int j = 0; j < kSteps; ++j) {
    Wgmma<float, N>::rs(d, hi[j], b_hi + BTile::k_step(j), j > 0);
    Wgmma<float, N>::rs(d, hi[j], b_lo + BTile::k_step(j), 1);
    Wgmma<float, N>::rs(d, lo[j], b_hi + BTile::k_step(j), 1);
  }
}

}  // namespace fmha::cuda::sm90
