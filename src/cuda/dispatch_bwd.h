// Backward dispatch: turns the runtime dtype and head-dim bucket of a filled BackwardParams into
// compiled kernel variants, and launches the row-wise helper kernels (backward_rows.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/backward_params.h"
#include "fmha/status.h"
#include "fmha/tensor.h"

namespace fmha::cuda {

// Column chunks of the dK/dV kernel for this problem and dtype (sets nothing; read by the caller).
int backward_num_chunks(const BackwardParams& p, DType dtype);

// Blocks the fused dK/dV kernel would launch (p.num_chunks set): what the auto rule weighs against
// the SM count.
std::int64_t backward_dkdv_blocks(const BackwardParams& p);

// dK/dV, plus the fused dQ atomics when p.dq_accum is set. `dtype` is q's (fp32, fp16 or bf16).
Status dispatch_backward_dkdv(const BackwardParams& p, DType dtype, cudaStream_t stream);
// dQ of the split backward.
Status dispatch_backward_dq(const BackwardParams& p, DType dtype, cudaStream_t stream);

// Whether the sm90 split backward (dK/dV and dQ kernels on wgmma, sm90/) takes this problem on a
// device of compute capability `arch` (major * 10 + minor): dense or varlen attention, fp16/bf16,
// every head dim, no mask or a causal/window mask, softcap or bias (with dbias, `wants_dbias`, but
// not both), SAM rel-pos alone where its layout applies; sinks and GQA run. Neighborhood
// attention, extra keys and fp32 run the sm80 kernels.
bool use_sm90_backward(const BackwardParams& p, bool wants_dbias, DType dtype, int arch);
// Whether the sm90 fused kernel (dK/dV with dQ reductions, fused_dq.cuh) takes a problem that
// use_sm90_backward takes: head-dim buckets 64 and 128, no rel-pos, no dbias, no neighborhood.
bool sm90_fused_backward_applies(const BackwardParams& p, bool wants_dbias);
// The sm90 dK/dV kernel (with the dQ reductions when p.dq_accum is set: only where
// sm90_fused_backward_applies) and the sm90 dQ kernel; only when use_sm90_backward.
Status dispatch_backward_sm90_dkdv(const BackwardParams& p, DType dtype, cudaStream_t stream);
Status dispatch_backward_sm90_dq(const BackwardParams& p, DType dtype, cudaStream_t stream);

// Whether the warp-specialized fused sm90 backward (sm90/mainloop_bwd_fused.cuh: one pass, dQ added
// to an fp32 accumulator by bulk reductions) takes this problem on a device of compute capability
// `arch`: fp16/bf16, head-dim buckets 64 and 128, dense batches, no mask or a causal/window mask,
// softcap, GQA, sinks and dlse; no bias, rel-pos, neighborhood attention or extra keys; q, k, v and
// dout describable by tensor maps (16-byte aligned rows). Deterministic mode orders the dQ adds.
bool use_sm90_fused_backward(const BackwardParams& p, DType dtype, int arch);
// Its dQ accumulator for `inner` rows a head (Lq, or total_q for varlen): floats, query tiles
// (deterministic mode's turn counters, one a tile) and the rows a head's row statistics need (the
// kernel copies whole query tiles of them); sets the accumulator's strides in p (p->dq_accum
// stays the caller's).
struct FusedAccumulatorSize {
  std::int64_t floats, tiles, stat_rows;
};
FusedAccumulatorSize sm90_fused_backward_accumulator(BackwardParams* p, std::int64_t inner,
                                                     bool varlen);
// Its kernel and the conversion of the accumulator into dq; only when use_sm90_fused_backward.
Status dispatch_backward_sm90_fused(const BackwardParams& p, DType dtype, cudaStream_t stream);

// Whether the sm90 fp32 backward (tf32 wgmma on split planes, sm90/mainloop_bwd_fp32.cuh) takes
// this problem on a device of compute capability `arch`: fp32 where the forward's rule,
// fp32_planes_apply (dispatch_fwd.h), lets the sm90 fp32 forward run; dlse too. It is split and
// deterministic by construction.
bool use_sm90_fp32_backward(const BackwardParams& p, DType dtype, int arch);
// Its planes pass, dK/dV kernel and dQ kernel; only when use_sm90_fp32_backward.
Status dispatch_backward_sm90_fp32(const BackwardParams& p, cudaStream_t stream);

// Row-wise helpers, over `outer` x `inner` rows of the [outer, H, inner] statistics layout
// (dense: B x Lq; varlen: 1 x total_q).
// Workspace that must read zero once the preprocess has run (the fp32 accumulators of dQ, dbias
// and drel, and the deterministic turn counters): `vectors` 16-byte vectors from `base` (16-byte
// aligned), zeroed by the preprocess kernel's threads in its stream order: no cudaMemsetAsync of
// their own (one a call for dQ's, one more for dbias / drel), a call that costs the host more than
// a launch (bench/cpp/host_call_costs.cu prices both).
struct ZeroedWorkspace {
  float4* base = nullptr;
  std::int64_t vectors = 0;
};
// Delta, lse_log2 and (with p.sink_term) the sink terms; `zeroed` zeroed (by a cudaMemsetAsync
// where there are no rows to launch the preprocess over).
Status launch_backward_preprocess(const BackwardParams& p, DType dtype, std::int64_t outer,
                                  std::int64_t inner, const ZeroedWorkspace& zeroed,
                                  cudaStream_t stream);
// dsinks[h] = -sum of the sink terms of head h, in a fixed order (deterministic).
Status launch_backward_dsinks(const BackwardParams& p, std::int64_t outer, std::int64_t inner,
                              cudaStream_t stream);
struct Extents4 {
  std::int64_t v[4];
};
// A compact row-major fp32 accumulator of `sizes` -> a gradient of `dtype` with strides
// `dst_stride` (dbias, drel_h, drel_w); src null writes zeros (a sum over no rows).
Status launch_backward_convert_4d(const float* src, const Extents4& sizes, void* dst,
                                  const Extents4& dst_stride, DType dtype, cudaStream_t stream);
// dq = scale * dq_accum in q's dtype (fused mode).
Status launch_backward_convert_dq(const BackwardParams& p, DType dtype, std::int64_t outer,
                                  std::int64_t inner, cudaStream_t stream);

}  // namespace fmha::cuda
