// Host entry of the sm90 product-helper checks (wgmma_products.cu, built for sm_90a only): each
// runs one warpgroup's product of src/cuda/sm90/tiles.cuh on bf16 operands copied into swizzled
// shared-memory tiles, and returns the fp32 accumulators in (row, column) order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fmha_cuda_test::sm90 {

enum class ProductForm {
  // C[64][32] = A[64][256] B[32..63][256]^T: ss_product, both K-major, B from its row 32.
  kKMajorFromRow32,
  // C[64][64] = 2 (A[:, 128..191])^T B, A [64 k][256], B [64 k][64]: mn_product run twice, the
  // second accumulating.
  kMnMajorAccumulate,
  // C[64][64] = (A[:, 192..255])^T B^T, A [64 k][256] MN-major, B [64 n][64 k] K-major: mk_product.
  kMnAByKMajorB,
  // The kKMajorFromRow32 result packed to bf16, stored by stmatrix into columns 32..63 of a
  // [64][64] tile (first chunk 4) and read back: C[64][32] (each entry bf16-rounded).
  kStoredFragments,
};

// Runs `form` on the current device; `a` and `b` are bf16 bit patterns in the row-major shapes
// above. Returns false with `error` set when CUDA fails.
bool run_product(ProductForm form, const std::vector<std::uint16_t>& a,
                 const std::vector<std::uint16_t>& b, std::vector<float>* c, std::string* error);

}  // namespace fmha_cuda_test::sm90
