// Pieces the CUDA forward and backward test cases share: varlen lengths -> cu_seqlens, the common
// part of a case's description, and an assertion on CUDA runtime calls.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <vector>

#include "fmha/fmha.h"
#include "test_util.h"

// ASSERTs that a CUDA runtime call succeeded (in functions returning void).
#define CUDA_CHECK(expr)                                                   \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

namespace fmha_cuda_test {

// Sum and maximum of varlen lengths, and their cumulative int32 offsets [0, l0, l0 + l1, ...].
std::int64_t total(const std::vector<std::int32_t>& lengths);
std::int64_t longest(const std::vector<std::int32_t>& lengths);
fmha_test::HostTensor cu_seqlens(const std::vector<std::int32_t>& lengths);

// Writes what every case description starts with: dtype, sizes (or varlen lengths), heads, head
// dims, and the scalar options (scale, masks, softcap, deterministic, allow_tf32).
void describe_problem(std::ostream& s, fmha::DType dtype, const std::vector<std::int32_t>& varlen_q,
                      const std::vector<std::int32_t>& varlen_k, std::int64_t batch,
                      std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t heads,
                      std::int64_t kv_heads, std::int64_t head_dim, std::int64_t value_dim,
                      const fmha::AttentionOptions& options);

}  // namespace fmha_cuda_test
