// One forward problem for the CUDA backend, described by value: random inputs (never zeros) are
// made on the host, copied to the GPU with the same strides, the outputs poisoned with NaN, and
// fmha::run on the GPU is compared element by element with fmha::run on float64 CPU copies (the
// reference), within SPEC §13's bound: 2 x the error of the naive same-dtype computation
// (tests/naive with S, P and out rounded to the dtype) + 1e-4 for fp16/bf16; norm-wise 1e-5 for
// fp32 (2e-3 with options.allow_tf32).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fmha/fmha.h"
#include "test_util.h"

namespace fmha_cuda_test {

using fmha::DType;
using fmha_test::Layout;

struct ForwardCase {
  DType dtype = DType::kFloat16;
  std::int64_t batch = 1, heads = 2, kv_heads = 1, head_dim = 64, value_dim = 64;
  std::int64_t seqlen_q = 17, seqlen_k = 17;     // dense
  std::vector<std::int32_t> varlen_q, varlen_k;  // non-empty: a varlen batch of these lengths
  fmha::AttentionOptions options;                // scalar options; tensors filled in here
  bool bias = false;
  std::array<bool, 4> bias_broadcast{false, false, false, false};  // broadcast dims of [B,H,Lq,Lk]
  bool bias_size_one = false;  // broadcast dims have size 1 (else: full size, stride 0)
  std::int64_t bias_pad = 0;   // extra elements after every bias row (padded row stride)
  std::int64_t rel_hk = 0;     // > 0: rel_h / rel_w over a key grid Hk x (Lk / Hk)
  bool sinks = false;
  std::int64_t extra = 0;  // R extra keys
  bool lse = true;
  Layout q_layout, kv_layout, out_layout;

  bool varlen() const { return !varlen_q.empty(); }
  std::string describe() const;
};

// True when a CUDA device is present; tests GTEST_SKIP otherwise.
bool gpu_available();
// Bytes of device memory free now (0 when the query fails).
std::size_t free_device_memory();

// Runs the case on the GPU and checks out and lse against the CPU reference; with `twice`, also
// runs it a second time and requires bitwise-identical outputs.
void check_forward(const ForwardCase& c, std::uint64_t seed, bool twice = false);

// Runs the case on the GPU and returns the status (for refusals).
fmha::Status run_forward_status(const ForwardCase& c);

}  // namespace fmha_cuda_test
