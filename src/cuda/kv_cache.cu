// CUDA entry points of attention over a KV cache and of the append into it (kv_cache.h): fill the
// kernel arguments from the validated views, choose the number of key splits, launch. No device
// synchronisation, no allocation, and no device query after a device's first call (its SM count and
// shared memory are cached), so the calls capture into CUDA graphs.
//
// Checked on an H100 (2026-11-27) against the CPU reference (tests/cuda/test_cuda_kv_cache.cpp, also
// under compute-sanitizer memcheck) and against fp32 SDPA (bench/kv_cache_decode.py).
//
// Three attention kernels (kv_cache_backend.h: kv_cache_kernel): for decode-sized calls the
// tensor-core split kernel (kv_cache_mma.cuh), the default, or the CUDA-core one
// (kv_cache_kernels.cuh), selected with FMHA_KV_CACHE_KERNEL=cuda-cores (read once per process)
// and run wherever the tensor-core kernel's layout does not fit the device's shared memory (the
// tensor-core one measured 1.8-5.5x faster on an H100, 2026-11-28, bench/cpp/kv_cache_decode_timing.cu,
// GQA 32/8, D 128); for prefill-sized calls on Hopper the dense sm90 forward reading the cache
// (kv_cache_forward.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "cuda/device_guard.h"
#include "cuda/kv_cache_backend.h"
#include "cuda/kv_cache_forward.h"
#include "cuda/kv_cache_launch.cuh"

namespace fmha::cuda {

namespace {

// -1: no override (the environment decides); else a KvCacheKernel.
std::atomic<int> kernel_override{-1};

}  // namespace

KvCacheKernel kv_cache_kernel() {
  const int forced = kernel_override.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<KvCacheKernel>(forced);
  static const KvCacheKernel from_env = [] {
    const char* value = std::getenv("FMHA_KV_CACHE_KERNEL");
    if (value == nullptr) return KvCacheKernel::kAuto;
    if (std::strcmp(value, "cuda-cores") == 0) return KvCacheKernel::kCudaCores;
    if (std::strcmp(value, "tensor-cores") == 0) return KvCacheKernel::kTensorCores;
    if (std::strcmp(value, "forward") == 0) return KvCacheKernel::kForward;
    return KvCacheKernel::kAuto;
  }();
  return from_env;
}

void override_kv_cache_kernel(const KvCacheKernel* kernel) {
  kernel_override.store(kernel != nullptr ? static_cast<int>(*kernel) : -1, std::memory_order_relaxed);
}

namespace {

// Whether a decode-sized call runs the tensor-core kernel (every choice but cuda-cores).
bool decode_on_tensor_cores() {
  return kv_cache_kernel() != KvCacheKernel::kCudaCores;
}

// Whether the call runs on the dense sm90 forward (kv_cache_forward.h), its workspace aside.
bool on_forward(const KvCacheForwardParams& p, const detail::KvCacheShape& shape) {
  const KvCacheKernel kernel = kv_cache_kernel();
  const bool wanted = kernel == KvCacheKernel::kForward ||
                      (kernel == KvCacheKernel::kAuto && kv_cache_forward_preferred(shape));
  return wanted && kv_cache_forward_applies(p, shape);
}

using kv_cache::kKeys;
using kv_cache::kMaxSplits;
using kv_cache::kRows;
using kv_cache::kThreads;

Status cuda_error(const char* what, cudaError_t e) {
  return Status::backend_error(std::string("fmha: ") + what + ": " + cudaGetErrorString(e));
}

Status check_dtype(DType dtype) {
  if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) return Status::ok_status();
  return Status::not_supported(std::string("fmha: the CUDA kernels of attention over a KV cache take "
                                           "float16 and bfloat16; got ") +
                               to_string(dtype) + " (float32 runs on CPU tensors)");
}

// What the split rule needs of a device, read once per device.
struct DeviceInfo {
  int sms = 0;
  int shared_per_sm = 0;
  int threads_per_sm = 0;
  int registers_per_sm = 0;
  int kernel_registers = 0;  // per thread, of the attention kernel (both dtypes compile alike)
  int max_shared_optin = 0;  // dynamic shared memory a block may take after cudaFuncSetAttribute
  int reserved_per_block = 0;
  bool dependent_launch = false;  // sm90 and newer: the combine overlaps the attention kernel's end
  int mma_registers[3] = {};  // of the tensor-core kernel, per head-dim bucket (64, 128, 256)
  bool mma_ready = false;     // the two above are set, the kernel's shared-memory limit raised
};

constexpr int kMaxDevices = 64;

Status device_info(int device, DeviceInfo* info) {
  static std::mutex mutex;
  static DeviceInfo cache[kMaxDevices];
  static bool known[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) {
    return Status::not_supported("fmha: CUDA device index " + std::to_string(device) +
                                 " is beyond the " + std::to_string(kMaxDevices) + " this build serves");
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (!known[device]) {
    DeviceInfo d;
    cudaError_t e = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess)
      e = cudaDeviceGetAttribute(&d.shared_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    if (e == cudaSuccess)
      e = cudaDeviceGetAttribute(&d.threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device);
    if (e == cudaSuccess)
      e = cudaDeviceGetAttribute(&d.registers_per_sm, cudaDevAttrMaxRegistersPerMultiprocessor, device);
    if (e == cudaSuccess)
      e = cudaDeviceGetAttribute(&d.max_shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (e == cudaSuccess)
      e = cudaDeviceGetAttribute(&d.reserved_per_block, cudaDevAttrReservedSharedMemoryPerBlock, device);
    int major = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e != cudaSuccess) return cuda_error("cudaDeviceGetAttribute failed", e);
    d.dependent_launch = major >= 9;
    cudaFuncAttributes attributes{};
    e = cudaFuncGetAttributes(&attributes, kv_cache::kv_cache_attention_kernel<__half>);
    if (e != cudaSuccess) return cuda_error("cudaFuncGetAttributes failed", e);
    d.kernel_registers = attributes.numRegs;
    cache[device] = d;
    known[device] = true;
  }
  // The tensor-core kernel, the first time a call on this device selects it: its shared-memory limit
  // raised (once per device, never per call) and its registers read.
  if (!cache[device].mma_ready && decode_on_tensor_cores()) {
    DeviceInfo& d = cache[device];
    cudaError_t e = kv_cache::allow_mma_shared<__half>(d.max_shared_optin);
    if (e == cudaSuccess) e = kv_cache::allow_mma_shared<__nv_bfloat16>(d.max_shared_optin);
    if (e != cudaSuccess) return cuda_error("cudaFuncSetAttribute failed", e);
    for (int n = 0; n < 3 && e == cudaSuccess; ++n) e = kv_cache::mma_registers(64 << n, &d.mma_registers[n]);
    if (e != cudaSuccess) return cuda_error("cudaFuncGetAttributes failed", e);
    d.mma_ready = true;
  }
  *info = cache[device];
  return Status::ok_status();
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

int shared_bytes(const detail::ProblemShape& s) {
  return kv_cache::shared_layout(static_cast<int>(s.head_dim), static_cast<int>(s.value_dim), 2).total;
}

std::int64_t row_tiles(const detail::ProblemShape& s) {
  return ceil_div(std::max<std::int64_t>(s.seqlen_q, 1) * (s.heads / s.kv_heads), kRows);
}

// Which attention kernel a call runs, and its dynamic shared memory.
struct Plan {
  int mma_stages = 0;     // > 0: the tensor-core kernel with that many stages
  int mma_row_tiles = 1;  // its row tiles a block (kv_cache::mma_row_tiles)
  int shared = 0;
};

Plan make_plan(const detail::ProblemShape& s, const DeviceInfo& info) {
  Plan plan;
  const int D = static_cast<int>(s.head_dim), Dv = static_cast<int>(s.value_dim);
  if (info.mma_ready && decode_on_tensor_cores()) {
    plan.mma_row_tiles = kv_cache::mma_row_tiles(static_cast<int>(std::min<std::int64_t>(row_tiles(s), 4)),
                                                 kv_cache::mma_bucket(D, Dv));
    plan.mma_stages = kv_cache::mma_stages(D, Dv, info.max_shared_optin, plan.mma_row_tiles, 0,
                                           kv_cache::mma_pair_limit(info.shared_per_sm, info.reserved_per_block));
  }
  plan.shared = plan.mma_stages > 0 ? kv_cache::mma_layout(D, Dv, plan.mma_stages, plan.mma_row_tiles).total
                                    : shared_bytes(s);
  return plan;
}

// Splits the rule asks for. CUDA-core kernel: enough blocks to fill every SM at the kernel's
// occupancy, with each split keeping at least two tiles of keys of a full cache (a first rule, not
// tuned). Tensor-core kernel: kv_cache::split_rule (waves x keys per split).
int rule_splits(const detail::KvCacheShape& shape, const DeviceInfo& info, const Plan& plan) {
  const detail::ProblemShape& s = shape.attention;
  if (plan.mma_stages > 0) {
    const int bucket = kv_cache::mma_bucket(static_cast<int>(s.head_dim), static_cast<int>(s.value_dim));
    const std::int64_t blocks = std::max<std::int64_t>(
        s.batch * s.kv_heads * ceil_div(row_tiles(s), plan.mma_row_tiles), 1);
    const int per_sm = kv_cache::mma_blocks_per_sm(plan.shared, info.reserved_per_block, info.shared_per_sm,
                                                   info.mma_registers[kv_cache::bucket_index(bucket)],
                                                   info.registers_per_sm, info.threads_per_sm);
    return kv_cache::split_rule(blocks, shape.cache.capacity, static_cast<std::int64_t>(info.sms) * per_sm,
                                kv_cache::mma_tile_keys(bucket));
  }
  const std::int64_t blocks = std::max<std::int64_t>(s.batch * s.kv_heads * row_tiles(s), 1);
  const int by_threads = info.threads_per_sm / kThreads;
  const int by_shared = info.shared_per_sm / std::max(plan.shared, 1);
  const int by_registers = info.registers_per_sm / std::max(info.kernel_registers * kThreads, 1);
  const int per_sm = std::max(std::min({by_threads, by_shared, by_registers}), 1);
  const std::int64_t resident = static_cast<std::int64_t>(info.sms) * per_sm;
  const std::int64_t wanted = ceil_div(resident, blocks);
  const std::int64_t useful = std::max<std::int64_t>(ceil_div(shape.cache.capacity, 2 * kKeys), 1);
  return static_cast<int>(std::clamp<std::int64_t>(std::min(wanted, useful), 1, kMaxSplits));
}

// Workspace bytes of `splits` splits: partial outputs [splits, total_q * H, Dv] then lse.
std::size_t split_bytes(const detail::ProblemShape& s, int splits) {
  if (splits <= 1) return 0;
  const std::size_t rows = static_cast<std::size_t>(s.total_q * s.heads) * static_cast<std::size_t>(splits);
  const std::size_t out_bytes = (rows * static_cast<std::size_t>(s.value_dim) * sizeof(float) + 15) / 16 * 16;
  return out_bytes + rows * sizeof(float);
}

int requested_splits(const KvCacheForwardParams& p, const detail::KvCacheShape& shape,
                     const DeviceInfo& info, const Plan& plan) {
  if (p.num_splits > 0) return std::min(p.num_splits, kMaxSplits);
  return rule_splits(shape, info, plan);
}

// Every row of a tensor whose last dimension holds the features (the cache [pages, rows, Hkv, D],
// the queries [B, Lq, H, D] or [total_q, H, D]) starts on 16 bytes and holds whole 8-element
// chunks: the kernels' vector loads apply.
bool rows_vectorizable(const TensorView& t) {
  constexpr std::int64_t kChunk = 8;  // 16 bytes of fp16 / bf16
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0 || t.size(-1) % kChunk != 0) return false;
  for (int d = 0; d + 1 < t.rank; ++d) {
    if (t.size(d) > 1 && t.stride_of(d) % kChunk != 0) return false;
  }
  return true;
}

QueryRows query_rows(const TensorView& t, bool packed) {
  if (packed) return {0, t.stride[0], t.stride[1]};
  return {t.stride[0], t.stride[1], t.stride[2]};
}

QueryRows lse_rows(const TensorView& t, bool packed) {
  if (!t.defined()) return {};
  if (packed) return {0, t.stride[1], t.stride[0]};  // [H, total_q]
  return {t.stride[0], t.stride[2], t.stride[1]};     // [B, H, Lq]
}

KvCacheKernelParams make_params(const KvCacheForwardParams& p, const detail::KvCacheShape& shape) {
  const detail::ProblemShape& s = shape.attention;
  const detail::KvCacheGeometry& g = shape.cache;
  const AttentionOptions& o = p.options;
  const bool packed = p.cu_seqlens_q.defined();
  KvCacheKernelParams k;
  k.q = p.q.data;
  k.out = p.out.data;
  k.lse = p.lse.defined() ? static_cast<float*>(p.lse.data) : nullptr;
  k.q_rows = query_rows(p.q, packed);
  k.out_rows = query_rows(p.out, packed);
  k.lse_rows = lse_rows(p.lse, packed);
  k.cu_seqlens_q = packed ? static_cast<const std::int32_t*>(p.cu_seqlens_q.data) : nullptr;
  k.cu_stride = packed ? p.cu_seqlens_q.stride[0] : 0;
  k.seqlen_q = s.seqlen_q;
  k.total_q = s.total_q;
  k.k = {p.k_cache.data, p.k_cache.stride[0], p.k_cache.stride[1], p.k_cache.stride[2]};
  k.v = {p.v_cache.data, p.v_cache.stride[0], p.v_cache.stride[1], p.v_cache.stride[2]};
  if (g.paged) {
    k.block_table = static_cast<const std::int32_t*>(p.block_table.data);
    k.table_batch = p.block_table.stride[0];
    k.table_page = p.block_table.stride[1];
  }
  k.cache_seqlens = static_cast<const std::int32_t*>(p.cache_seqlens.data);
  k.seqlens_stride = p.cache_seqlens.stride[0];
  k.page_size = g.page_size;
  k.num_pages = g.num_pages;
  k.capacity = g.capacity;
  k.vector_loads = rows_vectorizable(p.k_cache) && rows_vectorizable(p.v_cache);
  k.q_vector_loads = rows_vectorizable(p.q);
  k.batch = static_cast<int>(s.batch);
  k.heads = static_cast<int>(s.heads);
  k.kv_heads = static_cast<int>(s.kv_heads);
  k.group = static_cast<int>(s.heads / s.kv_heads);
  k.head_dim = static_cast<int>(s.head_dim);
  k.value_dim = static_cast<int>(s.value_dim);
  k.row_tiles = static_cast<int>(row_tiles(s));
  k.scale = s.scale;
  k.softcap = o.softcap;
  // causal is the window (unbounded, 0); both given: the tighter upper bound (SPEC §3).
  if (o.causal || o.window_right >= 0) {
    k.has_upper = true;
    k.upper = o.causal ? (o.window_right >= 0 ? std::min<std::int64_t>(o.window_right, 0) : 0)
                       : o.window_right;
  }
  if (o.window_left >= 0) {
    k.has_lower = true;
    k.lower = o.window_left;
  }
  if (o.sinks.defined()) {
    k.sinks = static_cast<const float*>(o.sinks.data);
    k.sinks_stride = o.sinks.stride[0];
  }
  return k;
}

}  // namespace

Status kv_cache_workspace_size(const KvCacheForwardParams& p, const detail::KvCacheShape& shape,
                               std::size_t* bytes) {
  *bytes = 0;
  FMHA_RETURN_IF_ERROR(check_dtype(p.q.dtype));
  if (on_forward(p, shape)) return kv_cache_forward_workspace(p, shape, bytes);
  DeviceGuard guard;
  FMHA_RETURN_IF_ERROR(guard.enter(p.q.device.index));
  DeviceInfo info;
  FMHA_RETURN_IF_ERROR(device_info(p.q.device.index, &info));
  *bytes = split_bytes(shape.attention, requested_splits(p, shape, info, make_plan(shape.attention, info)));
  return Status::ok_status();
}

Status run(const KvCacheForwardParams& p, const detail::KvCacheShape& shape, void* stream) {
  FMHA_RETURN_IF_ERROR(check_dtype(p.q.dtype));
  const detail::ProblemShape& s = shape.attention;
  if (s.batch == 0 || s.total_q == 0) return Status::ok_status();
  if (on_forward(p, shape)) {
    // Where the caller's workspace cannot hold the forward's scratch, the decode kernel runs.
    std::size_t needed = 0;
    FMHA_RETURN_IF_ERROR(kv_cache_forward_workspace(p, shape, &needed));
    const std::size_t available = p.workspace != nullptr ? p.workspace_bytes : 0;
    if (needed <= available) return run_kv_cache_forward(p, shape, stream);
  }
  const std::int64_t blocks = s.batch * s.kv_heads * row_tiles(s);
  if (blocks > 0x7fffffff) {
    return Status::not_supported("fmha: attention over a KV cache needs " + std::to_string(blocks) +
                                 " blocks (B * Hkv * query tiles), more than a CUDA grid holds");
  }
  DeviceGuard guard;
  FMHA_RETURN_IF_ERROR(guard.enter(p.q.device.index));
  DeviceInfo info;
  FMHA_RETURN_IF_ERROR(device_info(p.q.device.index, &info));

  KvCacheKernelParams k = make_params(p, shape);
  const Plan plan = make_plan(s, info);
  int splits = requested_splits(p, shape, info, plan);
  const std::size_t available = p.workspace != nullptr ? p.workspace_bytes : 0;
  while (splits > 1 && split_bytes(s, splits) > available) --splits;  // a small workspace: fewer
  k.num_splits = splits;
  if (splits > 1) {
    const std::size_t rows = static_cast<std::size_t>(s.total_q * s.heads) * static_cast<std::size_t>(splits);
    const std::size_t out_bytes = (rows * static_cast<std::size_t>(s.value_dim) * sizeof(float) + 15) / 16 * 16;
    k.partial_out = static_cast<float*>(p.workspace);
    k.partial_lse = reinterpret_cast<float*>(static_cast<unsigned char*>(p.workspace) + out_bytes);
  }
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const cudaError_t e =
      p.q.dtype == DType::kFloat16
          ? kv_cache::launch_attention<__half>(k, plan.mma_stages, plan.shared, cuda_stream,
                                               info.dependent_launch)
          : kv_cache::launch_attention<__nv_bfloat16>(k, plan.mma_stages, plan.shared, cuda_stream,
                                                      info.dependent_launch);
  if (e != cudaSuccess) return cuda_error("the KV-cache attention kernel failed to launch", e);
  return Status::ok_status();
}

Status run(const KvCacheAppendParams& p, const detail::KvCacheShape& shape, void* stream) {
  FMHA_RETURN_IF_ERROR(check_dtype(p.k_cache.dtype));
  const detail::ProblemShape& s = shape.attention;
  const std::int64_t tokens = shape.packed_new ? shape.new_tokens : s.batch * shape.new_tokens;
  if (tokens == 0 || s.batch == 0) return Status::ok_status();
  if (tokens > 0x7fffffff) {
    return Status::not_supported("fmha: the KV-cache append takes at most 2^31 - 1 new tokens; got " +
                                 std::to_string(tokens));
  }
  DeviceGuard guard;
  FMHA_RETURN_IF_ERROR(guard.enter(p.k_cache.device.index));
  const detail::KvCacheGeometry& g = shape.cache;
  KvCacheAppendKernelParams k;
  const int first = shape.packed_new ? 0 : 1;  // packed new tokens have no batch dimension
  k.k_new = p.k_new.data;
  k.v_new = p.v_new.data;
  k.k_new_batch = shape.packed_new ? 0 : p.k_new.stride[0];
  k.k_new_row = p.k_new.stride[first];
  k.k_new_head = p.k_new.stride[first + 1];
  k.v_new_batch = shape.packed_new ? 0 : p.v_new.stride[0];
  k.v_new_row = p.v_new.stride[first];
  k.v_new_head = p.v_new.stride[first + 1];
  if (shape.packed_new) {
    k.cu_seqlens_new = static_cast<const std::int32_t*>(p.cu_seqlens_new.data);
    k.cu_stride = p.cu_seqlens_new.stride[0];
  }
  k.new_tokens = shape.new_tokens;
  k.k_cache = p.k_cache.data;
  k.v_cache = p.v_cache.data;
  k.k_page = p.k_cache.stride[0];
  k.k_row = p.k_cache.stride[1];
  k.k_head = p.k_cache.stride[2];
  k.v_page = p.v_cache.stride[0];
  k.v_row = p.v_cache.stride[1];
  k.v_head = p.v_cache.stride[2];
  if (g.paged) {
    k.block_table = static_cast<const std::int32_t*>(p.block_table.data);
    k.table_batch = p.block_table.stride[0];
    k.table_page = p.block_table.stride[1];
  }
  k.cache_seqlens = static_cast<const std::int32_t*>(p.cache_seqlens.data);
  k.seqlens_stride = p.cache_seqlens.stride[0];
  k.page_size = g.page_size;
  k.num_pages = g.num_pages;
  k.max_pages = g.max_pages;
  k.capacity = g.capacity;
  k.batch = static_cast<int>(s.batch);
  k.kv_heads = static_cast<int>(s.kv_heads);
  k.head_dim = static_cast<int>(s.head_dim);
  k.value_dim = static_cast<int>(s.value_dim);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const auto grid = static_cast<unsigned>(tokens);
  if (p.k_cache.dtype == DType::kFloat16) {
    kv_cache::kv_cache_append_kernel<__half><<<grid, kThreads, 0, cuda_stream>>>(k);
  } else {
    kv_cache::kv_cache_append_kernel<__nv_bfloat16><<<grid, kThreads, 0, cuda_stream>>>(k);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_error("the KV-cache append kernel failed to launch", e);
  return Status::ok_status();
}

}  // namespace fmha::cuda
