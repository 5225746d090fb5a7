// host-call-costs: the host time of each CUDA runtime / driver call that an attention call makes
// (bench/host_overhead.py times the whole C++ entry; this prices its pieces): cudaGetDevice,
// cudaDeviceGetAttribute (which fmha asks once per device), cudaFuncSetAttribute (once per kernel
// and device), cudaGetLastError, launches of an empty kernel with a small parameter block and with
// blocks of the kernels' sizes, cudaMemsetAsync of a dQ accumulator and of 4 bytes (beside
// cuStreamWriteValue32, which writes 4 bytes without a kernel), a workspace allocation and free
// from a pool like fmha's (workspace_pool.cu), and cuTensorMapEncodeTiled of a q-sized bf16
// tensor. Each row: the median over rounds of a call's mean host time over the round's calls,
// read before the round's synchronisation (the GPU's time is not in it). No library, no Python;
// built by hand:
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o host-call-costs \
//        bench/cpp/host_call_costs.cu
//   ./host-call-costs            # sizes of B 1, H 8, L 128, D 64
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

constexpr int kRounds = 50;
constexpr int kCalls = 100;  // a round's calls: few enough that no launch queue fills

// Parameter blocks of the kernels' sizes (nvcc 13, sm_90a build): BackwardParams alone (the
// preprocess and the dQ conversion), ForwardParams with the forward's three tensor maps, and
// BackwardParams with the fused backward's four (past 4 KB, the limit before CUDA 12.1).
template <int kBytes>
struct alignas(64) Params {
  unsigned char bytes[kBytes];
};

__global__ void empty_kernel(int) {}
template <int kBytes>
__global__ void empty_params_kernel(const __grid_constant__ Params<kBytes>) {}

template <int kBytes>
void launch_with_params(cudaStream_t stream) {
  static const Params<kBytes> params{};
  empty_params_kernel<kBytes><<<8, 256, 0, stream>>>(params);
}

// Median microseconds a call of `call` over kRounds rounds of kCalls calls.
template <typename Call>
double host_us(cudaStream_t stream, Call&& call) {
  std::vector<double> rounds;
  for (int r = 0; r <= kRounds; ++r) {
    CHECK(cudaStreamSynchronize(stream));
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) call();
    const auto end = std::chrono::steady_clock::now();
    const double us = std::chrono::duration<double, std::micro>(end - start).count();
    if (r > 0) rounds.push_back(us / kCalls);
  }
  CHECK(cudaStreamSynchronize(stream));
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// A driver function by name (the 12.0 ABI), or nullptr.
void* driver_function(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
#else
  const cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found);
#endif
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return fn;
}

using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                            const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                            CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                            CUtensorMapFloatOOBfill);

}  // namespace

int main() {
  const std::int64_t B = 1, H = 8, L = 128, D = 64;
  int device = 0;
  CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, device));
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* q = nullptr;
  CHECK(cudaMalloc(&q, static_cast<std::size_t>(B * L * H * D) * 2));
  const std::size_t accum_bytes = static_cast<std::size_t>(B * H * L * D) * 4;
  void* accum = nullptr;
  CHECK(cudaMalloc(&accum, accum_bytes));

  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  CHECK(cudaMemPoolCreate(&pool, &props));
  std::uint64_t threshold = std::uint64_t{1} << 30;
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));

  const auto encode = reinterpret_cast<Encode>(driver_function("cuTensorMapEncodeTiled"));
  const auto write_value = reinterpret_cast<WriteValue32>(driver_function("cuStreamWriteValue32"));
  if (encode == nullptr) {
    std::fprintf(stderr, "the driver has no cuTensorMapEncodeTiled\n");
    return 1;
  }
  // q [B, L, H, D] as the kernels map it (tile_copies.cuh): columns, then the outer dimensions by
  // growing stride (heads, rows, batches); boxes of 64 columns x 128 rows.
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(H),
                              static_cast<cuuint64_t>(L), static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(D * 2),
                                 static_cast<cuuint64_t>(H * D * 2),
                                 static_cast<cuuint64_t>(L * H * D * 2)};
  const cuuint32_t box[4] = {64, 1, 128, 1}, element_strides[4] = {1, 1, 1, 1};
  alignas(64) CUtensorMap map;

  int value = 0;
  std::printf("host time per call on %s (B %lld H %lld L %lld D %lld sizes), median of %d rounds "
              "of %d calls, before synchronising\n",
              prop.name, static_cast<long long>(B), static_cast<long long>(H),
              static_cast<long long>(L), static_cast<long long>(D), kRounds, kCalls);
  auto row = [](const char* what, double us) { std::printf("  %-52s %7.2f us\n", what, us); };
  row("cudaGetDevice", host_us(stream, [&] { CHECK(cudaGetDevice(&value)); }));
  row("cudaDeviceGetAttribute (SM count)", host_us(stream, [&] {
        CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device));
      }));
  row("cudaFuncSetAttribute (max dynamic smem, same value)", host_us(stream, [&] {
        CHECK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   100 * 1024));
      }));
  row("cudaGetLastError", host_us(stream, [&] { CHECK(cudaGetLastError()); }));
  row("launch, 4 bytes of parameters", host_us(stream, [&] {
        empty_kernel<<<8, 256, 0, stream>>>(0);
      }));
  row("launch, 3264 bytes of parameters (BackwardParams)",
      host_us(stream, [&] { launch_with_params<3264>(stream); }));
  row("launch, 3904 bytes (ForwardParams + 3 maps)",
      host_us(stream, [&] { launch_with_params<3904>(stream); }));
  row("launch, 4288 bytes (BackwardParams + 4 maps)",
      host_us(stream, [&] { launch_with_params<4288>(stream); }));
  row("cudaMemsetAsync of the dQ accumulator (B*H*L*D floats)", host_us(stream, [&] {
        CHECK(cudaMemsetAsync(accum, 0, accum_bytes, stream));
      }));
  row("cudaMemsetAsync of 4 bytes (the forward's tile counter)", host_us(stream, [&] {
        CHECK(cudaMemsetAsync(accum, 0, 4, stream));
      }));
  if (write_value != nullptr) {  // a stream memory operation: no kernel
    row("cuStreamWriteValue32 (4 bytes)", host_us(stream, [&] {
          if (write_value(stream, reinterpret_cast<CUdeviceptr>(accum), 0, 0) != CUDA_SUCCESS) {
            std::fprintf(stderr, "cuStreamWriteValue32 failed\n");
            std::exit(1);
          }
        }));
  }
  row("cudaMallocFromPoolAsync + cudaFreeAsync (that size)", host_us(stream, [&] {
        void* p = nullptr;
        CHECK(cudaMallocFromPoolAsync(&p, accum_bytes + 8 * 1024, pool, stream));
        CHECK(cudaFreeAsync(p, stream));
      }));
  row("cuTensorMapEncodeTiled (q, bf16, 128-byte swizzle)", host_us(stream, [&] {
        if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, q, dims, strides, box,
                   element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
          std::fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
          std::exit(1);
        }
      }));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaGetLastError());  // the launches' errors
  return 0;
}
