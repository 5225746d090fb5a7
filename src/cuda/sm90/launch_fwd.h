// Launch of the sm90 forward kernel for one compile-time variant. Declared here for the dispatch;
// defined in launch_fwd.cuh and instantiated in generated/fwd_*.cu (scripts/gen_instantiations.py),
// compiled for sm_90a only (FMHA_WITH_SM90 tells the dispatch they exist).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/forward_params.h"
#include "fmha/status.h"

namespace fmha::cuda::sm90 {

// Runs the forward for `p` on `stream` with dtype T (__half / __nv_bfloat16), head-dim bucket kD
// and policy Policy (cuda/common/forward_policies.cuh). Asynchronous: checks launch errors only.
template <typename T, int kD, typename Policy>
Status launch_forward(const ForwardParams& p, cudaStream_t stream);

// Whether plain attention at head-dim bucket kD over `seqlen_q` query rows takes the window
// policy's kernel (with an unbounded window no tile is masked) instead of its own. Up to D 64 the
// plain policy runs 192-row tiles on three math warpgroups (forward_pipeline.cuh:
// fwd_warp_groups), whose padding of short rows costs more than three warpgroups gain where it
// is over a quarter more rows than the window kernel's 128-row tiles (Lq up to 128, 193-256).
// Measured on an H200 (2026-11-29, bf16, D 64, 16k tokens, kernels alone): L 128 0.113 -> 0.104
// ms, L 256 0.163 -> 0.142; at L 512 (a ninth more rows) three stay ahead, 0.200 against 0.219.
template <int kD>
constexpr bool plain_on_window_kernel(std::int64_t seqlen_q) {
  if (kD > 64) return false;
  const std::int64_t rows_of_three = (seqlen_q + 191) / 192 * 192;
  const std::int64_t rows_of_two = (seqlen_q + 127) / 128 * 128;
  return rows_of_three * 4 > rows_of_two * 5;
}
static_assert(plain_on_window_kernel<64>(128) && plain_on_window_kernel<64>(256) &&
                  !plain_on_window_kernel<64>(192) && !plain_on_window_kernel<64>(512) &&
                  !plain_on_window_kernel<128>(128),
              "short rows up to D 64 only, where 192-row tiles pad by over a quarter");

}  // namespace fmha::cuda::sm90
