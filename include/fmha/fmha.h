// fmha: exact, memory-efficient fused attention, forward and backward.
//
// Every entry point comes as a pair:
//   fmha::Status fmha::check(const Params&)            validates without touching any memory;
//   fmha::Status fmha::run(const Params&, void* stream) validates, then computes.
// run() writes nothing when validation fails. CPU tensors run on the CPU backend (stream ignored);
// CUDA tensors run on the CUDA backend on `stream` (a cudaStream_t; nullptr is the legacy default
// stream). No entry point synchronises the device.
#pragma once

#include "fmha/kv_cache.h"
#include "fmha/params.h"
#include "fmha/status.h"
#include "fmha/tensor.h"

namespace fmha {

Status check(const AttentionForwardParams& params);
Status check(const AttentionBackwardParams& params);
Status check(const VarlenForwardParams& params);
Status check(const VarlenBackwardParams& params);
Status check(const NeighborhoodForwardParams& params);
Status check(const NeighborhoodBackwardParams& params);
Status check(const MergeForwardParams& params);
Status check(const MergeBackwardParams& params);

Status run(const AttentionForwardParams& params, void* stream = nullptr);
Status run(const AttentionBackwardParams& params, void* stream = nullptr);
Status run(const VarlenForwardParams& params, void* stream = nullptr);
Status run(const VarlenBackwardParams& params, void* stream = nullptr);
Status run(const NeighborhoodForwardParams& params, void* stream = nullptr);
Status run(const NeighborhoodBackwardParams& params, void* stream = nullptr);
Status run(const MergeForwardParams& params, void* stream = nullptr);
Status run(const MergeBackwardParams& params, void* stream = nullptr);

// True when this build contains the CUDA backend.
bool built_with_cuda();
const char* version();

}  // namespace fmha
