// Tile-size choices of the sm80 (mma.sync) forward kernel, one place, each with its reason.
//
// Measured (nvcc 13.0, -Xptxas -v, sm_80 and sm_90a alike): no variant spills or has a stack
// frame. Registers per thread, plain / general policy: bucket 32 160-168 / 250-255 and 64
// 242-248 / 253-255 (two row blocks a warp), 96 162 / 249-252, 128 224-228 / 249-255, 160
// 167-168 / 234-235, 192-256 230-255 / 235-248. So 2 blocks of 4 warps share an SM (3 for the
// small plain ones). H100, fp16, B 4 x L 4096 x H 16, median of 10: 208 TFLOP/s at D = 64 (184
// with one row block a warp), 181 at D = 128 (166 causal), 173 at D = 256; D = 80 (bucket 96,
// B 16) 181. FlashAttention-2 reaches about 1.8x that on an
// H100; two row blocks a warp at D = 96 / 128 spill (120 / 432 bytes in the general policy)
// until the ~130 registers the kernel holds besides its accumulators are trimmed.
#pragma once

namespace fmha::cuda::sm80 {

// Head-dim buckets: a problem runs in the smallest bucket >= max(D, Dv); columns past D / Dv are
// zero-filled on load, skipped in the products 16 at a time, and never stored.
// Multiples of 32 keep every common head dim close to its bucket (SAM's 80 runs as 96, not 128;
// 40 as 64, 72 as 96, 200 as 224) while holding the instantiation count, and so the build, to
// 8 buckets. A 16-granular set would halve the waste of the worst cases (e.g. 80 -> 80) at twice
// the compile time; powers of two would run D = 80 and 96 as 128 (up to 60% wasted MMA work).
inline constexpr int kHeadDimBucketStep = 32;
inline constexpr int kMaxHeadDim = 256;

constexpr int head_dim_bucket(int head_dim) {
  return (head_dim + kHeadDimBucketStep - 1) / kHeadDimBucketStep * kHeadDimBucketStep;
}

// 4 warps per block. Each warp owns row_blocks(D) blocks of 16 query rows (m16 MMA row blocks):
// two at small head dims, so that every K/V fragment read by ldmatrix feeds two MMAs and a block
// loads K/V once for 128 queries (FlashAttention-2's layout); one above, where the output
// accumulator (Dv/2 floats a thread per row block) leaves no registers for a second. fp32 runs
// one row block a warp everywhere: at D = 64 two spill in the general and neighborhood policies
// (its split fragments, hi and lo, double the operand registers), and a K/V fragment already
// feeds three tensor-core products per row block.
//
// Every size below is templated on the dtype T (__half, __nv_bfloat16, float): fp32 tiles take
// twice the shared memory per element.
inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
template <typename T>
constexpr int elem_bytes() {
  return static_cast<int>(sizeof(T));
}
template <typename T>
constexpr int row_blocks(int head_dim_bucket) {
  if (elem_bytes<T>() == 4) return 1;
  return head_dim_bucket <= 64 ? 2 : 1;
}
template <typename T>
constexpr int block_m(int head_dim_bucket) {
  return kWarps * 16 * row_blocks<T>(head_dim_bucket);
}
// Rows of a block with one row block per warp (the backward's dQ kernel uses this layout).
inline constexpr int kBlockM = kWarps * 16;

// Keys per tile. 16-bit: 64 up to D = 128; 32 above, where the score tile (block_n / 2 floats a
// thread) would otherwise push the 256-bucket past 255 registers, and where the K/V tiles would
// push shared memory past what two blocks per SM can share on an A100. fp32: 64 up to D = 64,
// 32 up to 160, 16 above, the most that keeps Q, K and V (twice the bytes) inside the 99 KB an
// sm86/sm89 block may have (the neighborhood bookkeeping at D = 256 is the one exception,
// launch_fwd.cuh).
template <typename T>
constexpr int block_n(int head_dim_bucket) {
  if (elem_bytes<T>() == 4) return head_dim_bucket <= 64 ? 64 : (head_dim_bucket <= 160 ? 32 : 16);
  return head_dim_bucket <= 128 ? 64 : 32;
}

// Shared-memory rows are padded by 16 bytes so that the 8 row addresses of one ldmatrix land in 8
// different 16-byte bank groups (no conflicts) without a swizzle; for fp32 the pitch is then 4
// words past a multiple of 32, which also keeps the column loads (tile_operands.cuh: rows 2c,
// 2c + 1 at column g) on 32 distinct banks.
inline constexpr int kSmemPadBytes = 16;
template <typename T>
constexpr int smem_row(int head_dim_bucket) {
  return head_dim_bucket + kSmemPadBytes / elem_bytes<T>();
}

// One Q tile, one K tile and one V tile: K of tile t + 1 loads while P.V of tile t runs, V of
// tile t while Q.K of tile t runs. The output tile reuses Q's rows.
template <typename T>
constexpr int smem_bytes(int head_dim_bucket) {
  return (block_m<T>(head_dim_bucket) + 2 * block_n<T>(head_dim_bucket)) *
         smem_row<T>(head_dim_bucket) * elem_bytes<T>();
}

// What every sm80+ GPU lets a block have (sm86/sm89: 99 KB), and what the largest (sm90) does.
inline constexpr int kPortableSmemBytes = 99 * 1024;
inline constexpr int kMaxSmemBytes = 227 * 1024;

static_assert(smem_bytes<short>(kMaxHeadDim) <= kPortableSmemBytes,
              "sm86/sm89 allow at most 99 KB per block");
static_assert(smem_bytes<float>(kMaxHeadDim) <= kPortableSmemBytes,
              "sm86/sm89 allow at most 99 KB per block");

}  // namespace fmha::cuda::sm80
