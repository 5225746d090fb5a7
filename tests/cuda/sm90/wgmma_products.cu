// Device side of the sm90 product-helper checks (wgmma_products.h): one warpgroup loads A and B
// into swizzled tiles (chunk_offset), runs one product form, and writes its accumulators out.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm90/tiles.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/sm90/wgmma_products.h"

namespace fmha_cuda_test::sm90 {
namespace {

using namespace fmha::cuda::sm90;
using T = __nv_bfloat16;
using Wide = SwizzledTile<64, 256>;   // A of every form; B of kKMajorFromRow32
using Square = SwizzledTile<64, 64>;  // B of the MN-major forms; the stmatrix target

// Copies a row-major [kRows][kCols] bf16 matrix into the swizzled tile at `smem` (all 128 threads).
template <typename Tile, int kRows, int kCols>
__device__ void load_tile(std::uint32_t smem, const std::uint16_t* src) {
  for (int i = threadIdx.x; i < kRows * kCols / 8; i += 128) {
    const int r = i / (kCols / 8), c = i % (kCols / 8);
    const uint4 v = *reinterpret_cast<const uint4*>(src + r * kCols + c * 8);
    asm volatile(
        "st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem + Tile::chunk_offset(r, c)),
        "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
        : "memory");
  }
}

// The warpgroup's accumulators (m16n8 C layout, rows 16 warp + lane / 4 (+ 8)) into c[64][8
// kTiles].
template <int kTiles>
__device__ void store_accumulators(const float (&acc)[kTiles][4], float* c) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = warp * 16 + lane / 4 + 8 * (e / 2), col = t * 8 + 2 * (lane % 4) + (e & 1);
      c[row * kTiles * 8 + col] = acc[t][e];
    }
  }
}

__global__ void __launch_bounds__(128)
    product_kernel(ProductForm form, const std::uint16_t* a, const std::uint16_t* b, float* c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const std::uint32_t base = (fmha::cuda::tile::shared_address(smem_raw) + 1023u) & ~1023u;
  const std::uint32_t smem_a = base, smem_b = base + Wide::kBytes;
  const std::uint32_t smem_out = smem_b + Wide::kBytes;
  load_tile<Wide, 64, 256>(smem_a, a);
  if (form == ProductForm::kKMajorFromRow32 || form == ProductForm::kStoredFragments) {
    load_tile<Wide, 64, 256>(smem_b, b);
  } else {
    load_tile<Square, 64, 64>(smem_b, b);
  }
  fence_proxy_async();
  __syncthreads();
  if (form == ProductForm::kKMajorFromRow32 || form == ProductForm::kStoredFragments) {
    float acc[4][4];
    zero_accumulators(acc);
    wgmma_fence();
    ss_product<T, 16, Wide, Wide>(acc, smem_a, 0, smem_b, 32);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(acc);
    if (form == ProductForm::kKMajorFromRow32) {
      store_accumulators(acc, c);
      return;
    }
    std::uint32_t frag[2][4];
    pack_fragments<T>(acc, frag);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    store_fragments_stmatrix<Square>(smem_out, warp * 16, frag, lane, 4);
    __syncthreads();
    for (int i = threadIdx.x; i < 64 * 32; i += 128) {
      const int r = i / 32, col = 32 + i % 32;
      std::uint16_t bits;
      asm volatile("ld.shared.u16 %0, [%1];\n"
                   : "=h"(bits)
                   : "r"(smem_out + Square::chunk_offset(r, col / 8) + (col % 8) * 2));
      c[i] = __bfloat162float(__ushort_as_bfloat16(bits));
    }
    return;
  }
  float acc[8][4];
  zero_accumulators(acc);
  if (form == ProductForm::kMnMajorAccumulate) {
    for (int pass = 0; pass < 2; ++pass) {
      wgmma_fence();
      mn_product<T, 4, Wide, Square>(acc, smem_a, 128, smem_b, 0, pass > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(acc);
    }
  } else {
    wgmma_fence();
    mk_product<T, 4, Wide, Square>(acc, smem_a, 192, smem_b, 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(acc);
  }
  store_accumulators(acc, c);
#endif
}

}  // namespace

bool run_product(ProductForm form, const std::vector<std::uint16_t>& a,
                 const std::vector<std::uint16_t>& b, std::vector<float>* c, std::string* error) {
  const bool wide_b =
      form == ProductForm::kKMajorFromRow32 || form == ProductForm::kStoredFragments;
  if (a.size() != 64 * 256 || b.size() != (wide_b ? 64 * 256 : 64 * 64)) {
    *error = "operand sizes do not match the form";
    return false;
  }
  const std::size_t c_count =
      form == ProductForm::kMnMajorAccumulate || form == ProductForm::kMnAByKMajorB ? 64 * 64
                                                                                    : 64 * 32;
  std::uint16_t *da = nullptr, *db = nullptr;
  float* dc = nullptr;
  auto fail = [&](cudaError_t e) {
    *error = cudaGetErrorString(e);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    return false;
  };
  cudaError_t e = cudaMalloc(&da, a.size() * 2);
  if (e == cudaSuccess) e = cudaMalloc(&db, b.size() * 2);
  if (e == cudaSuccess) e = cudaMalloc(&dc, c_count * 4);
  if (e == cudaSuccess) e = cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) return fail(e);
  const int smem = 1024 + 2 * Wide::kBytes + Square::kBytes;
  e = cudaFuncSetAttribute(product_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return fail(e);
  product_kernel<<<1, 128, smem>>>(form, da, db, dc);
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return fail(e);
  c->assign(c_count, 0.0f);
  e = cudaMemcpy(c->data(), dc, c_count * 4, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return fail(e);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  return true;
}

}  // namespace fmha_cuda_test::sm90
