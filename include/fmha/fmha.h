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

// Bytes of scratch memory run(params) takes at most (params.workspace, params.h): validates params
// first (their workspace is not read), then plans the call as run() would on the tensors' device,
// launching nothing. Depends on the shapes, dtypes, options and the device, never on tensor
// contents, so a serving engine can size one buffer ahead (CUDA graph capture included). 0 on the
// CPU. Merge calls need none.
Status workspace_size(const AttentionForwardParams& params, std::size_t* bytes);
Status workspace_size(const AttentionBackwardParams& params, std::size_t* bytes);
Status workspace_size(const VarlenForwardParams& params, std::size_t* bytes);
Status workspace_size(const VarlenBackwardParams& params, std::size_t* bytes);
Status workspace_size(const NeighborhoodForwardParams& params, std::size_t* bytes);
Status workspace_size(const NeighborhoodBackwardParams& params, std::size_t* bytes);

// True when this build contains the CUDA backend.
bool built_with_cuda();
const char* version();
// The instruction set the fast CPU backend's kernels run on this machine, as FMHA_CPU_ISA leaves it:
// "avx512bf16" (AVX-512 with its bf16 dot product), "avx512", "avx2" or "portable".
const char* cpu_isa();

// The fast CPU backend runs a call's workers on threads of its own, kept between calls. A host
// that already keeps an OpenMP team (PyTorch does; fmha's Python package hands it over) can have
// the workers run on that team instead, so that the two sets of threads do not compete for the
// cores: `parallel` with the signature of libgomp's GOMP_parallel (runs fn(data) on up to `threads`
// threads of a team, the calling thread among them, and returns when all are done; fmha passes
// flags 0) and `thread_num` with omp_get_thread_num's. Both null: fmha's own threads again. Calls
// that start after it returns use the new choice; results do not depend on it.
struct CpuParallelRuntime {
  void (*parallel)(void (*fn)(void*), void* data, unsigned threads, unsigned flags) = nullptr;
  int (*thread_num)() = nullptr;
};
void set_cpu_parallel_runtime(const CpuParallelRuntime& runtime);

}  // namespace fmha
