// kv-cache-decode-timing: the two KV-cache attention kernels (the CUDA-core kernel of
// kv_cache_kernels.cuh and the tensor-core kernel of kv_cache_mma.cuh), each with its own split
// rule and the combine, launched directly on the same random bf16 decode inputs (one query token,
// every sequence full, causal), a contiguous cache or paged caches (the pages of the pool in a
// random order). CUDA events around each launch, the L2 flushed in between, the median of 30;
// bandwidth counts the K and V bytes read; with splits, the combine kernel is also timed alone
// ([combine ... ms], part of the total; then again without the L2 flush, its partials in L2 as
// after the kernel that wrote them). A device-to-device copy of 1 GiB gives the card's copy
// bandwidth for scale (read + write bytes).
//
// Correctness: the tensor-core kernel's out and lse are compared element-wise with the CUDA-core
// kernel's (already checked against the float64 oracle by tests/cuda/test_cuda_kv_cache.cpp); the
// tool prints the max abs differences and exits with 1 when the out difference exceeds 2e-2 of the
// largest |out| or an lse difference exceeds 2e-2. So one run tells correctness and speed.
//
//   nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a
//        -Isrc -Iinclude -Ibench/cpp -o kv-cache-decode-timing bench/cpp/kv_cache_decode_timing.cu
//   (one line)
//   ./kv-cache-decode-timing            # GQA 32/8 D 128: B 1 / 8 x L 4k / 32k / 128k x pages
//   ./kv-cache-decode-timing quick      # B 1 L 128k and B 8 L 32k, contiguous and pages of 64
//   ./kv-cache-decode-timing case=B,L,H,Hkv,D,page ...   # these cases only (page 0: contiguous)
//   options: splits=N (the tensor-core kernel with N splits instead of its rule), stages=N
//   (instead of mma_stages), tile_keys=32 (32-key tiles at D 128, two row tiles a block so that each
//   warp keeps a 16-key k-step, instead of the library's 64), tile_keys=64 (64-key tiles instead of
//   the library's 128 at D <= 64 and its 32 at D 256, where a block then takes the fewest row tiles
//   that cover a kv head's rows),
//   fast (the tensor-core kernel alone, no comparison), q_elements (Q staged element by element, the
//   kernels' fallback for query rows that are not 16-byte aligned, instead of 16-byte copies),
//   plain_combine (the combine launched after the attention kernel, as before sm90, instead of
//   overlapping its end), head_major (each page's rows head by head, [pages, Hkv, page_size, D],
//   instead of the usual [pages, page_size, Hkv, D]: a head's keys of a page contiguous)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string_view>
#include <vector>

#include "cuda/kv_cache_launch.cuh"
#include "kernel_timing.h"

namespace {

using fmha::cuda::KvCacheKernelParams;
namespace kv = fmha::cuda::kv_cache;

constexpr int kTimedRuns = 30;

struct Case {
  int B = 1, L = 4096, H = 32, Hkv = 8, D = 128, page = 0;  // page 0: contiguous
};

struct Options {
  int splits = 0, stages = 0, tile_keys = 0;  // 0: the library's choice
  bool fast = false;                          // the tensor-core kernel alone
  bool q_elements = false;                    // Q by element loads, not 16-byte copies
  bool head_major = false;                    // pages [pages, Hkv, rows, D], not [pages, rows, Hkv, D]
  bool plain_combine = false;                 // the combine launched after the kernel, no overlap
};

// Uniform in [-sqrt(3), sqrt(3)) (unit variance) from a hash of the index and the seed.
__global__ void fill_random(__nv_bfloat16* data, std::size_t n, unsigned long long seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    unsigned long long x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    const float u = float(x >> 40) / float(1ull << 24);
    data[i] = __float2bfloat16((2.0f * u - 1.0f) * 1.7320508f);
  }
}

__nv_bfloat16* device_random_bf16(std::size_t n, unsigned long long seed) {
  __nv_bfloat16* d = nullptr;
  CHECK(cudaMalloc(&d, n * sizeof(__nv_bfloat16)));
  fill_random<<<1024, 256>>>(d, n, seed);
  CHECK(cudaGetLastError());
  return d;
}

struct Device {
  int sms = 0, shared_per_sm = 0, max_shared = 0, reserved = 0, registers_per_sm = 0,
      threads_per_sm = 0, major = 0;
};

Device query_device() {
  Device d;
  CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&d.shared_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
  CHECK(cudaDeviceGetAttribute(&d.max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  CHECK(cudaDeviceGetAttribute(&d.reserved, cudaDevAttrReservedSharedMemoryPerBlock, 0));
  CHECK(cudaDeviceGetAttribute(&d.registers_per_sm, cudaDevAttrMaxRegistersPerMultiprocessor, 0));
  CHECK(cudaDeviceGetAttribute(&d.threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, 0));
  CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, 0));
  return d;
}

// The CUDA-core kernel's split rule of kv_cache.cu, its blocks per SM from the occupancy calculator
// (kv_cache.cu derives them from the device limits without the 1 KB a block reserves: at most one
// block an SM apart).
int cuda_core_splits(const Device& dev, std::int64_t blocks, std::int64_t capacity, int shared) {
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, kv::kv_cache_attention_kernel<__nv_bfloat16>, kv::kThreads, shared));
  const std::int64_t resident = std::int64_t(dev.sms) * std::max(per_sm, 1);
  const std::int64_t wanted = (resident + blocks - 1) / blocks;
  const std::int64_t useful = std::max<std::int64_t>((capacity + 2 * kv::kKeys - 1) / (2 * kv::kKeys), 1);
  return int(std::clamp<std::int64_t>(std::min(wanted, useful), 1, kv::kMaxSplits));
}

double copy_bandwidth_tbs() {
  const std::size_t bytes = std::size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMemset(a, 1, bytes));
  const std::vector<float> ms =
      sorted_launch_ms([&] { CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 10);
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  return 2.0 * double(bytes) / (ms[5] * 1e9);
}

struct Result {
  // combine_ms: the combine kernel alone, inside ms (L2 flushed before it); combine_hot_ms: the
  // same with its partials in L2.
  float ms = 0.0f, combine_ms = 0.0f, combine_hot_ms = 0.0f;
  int splits = 0, stages = 0;
  std::vector<__nv_bfloat16> out;
  std::vector<float> lse;
};

// The tensor-core kernel in a form the library does not launch (tile_keys=64): at bucket 64 with
// 64-key tiles (the library takes 128), at bucket 256 with 64-key tiles and one row tile a block
// where one covers the rows (the library takes 32 keys, with two row tiles so that each warp keeps a
// 16-key k-step). Launched as
// kv_cache_launch.cuh's launch_attention launches the library's forms.
template <int kBucket, int kRowTiles, int kKeys>
void launch_variant(const KvCacheKernelParams& k, int stages, int shared, bool overlap) {
  auto kernel = kv::kv_cache_mma_kernel<__nv_bfloat16, kBucket, kRowTiles, kKeys>;
  static bool ready = false;
  if (!ready) {
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    ready = true;
  }
  const dim3 grid(unsigned(kv::mma_grid_blocks(k, kRowTiles)), k.num_splits);
  kernel<<<grid, kv::kMmaThreads, shared>>>(k, stages);
  CHECK(cudaGetLastError());
  if (k.num_splits > 1) {
    CHECK(kv::launch_combine<__nv_bfloat16>(k, nullptr, overlap));
  }
}

bool run_case(const Device& dev, const Case& c, const Options& opt, double copy_tbs) {
  const int B = c.B, L = c.L, H = c.H, Hkv = c.Hkv, D = c.D, page_size = c.page;
  std::mt19937 gen(1234u + unsigned(B) * 7u + unsigned(L) + unsigned(page_size) + unsigned(H * Hkv * D));
  const std::int64_t rows = page_size > 0 ? page_size : L;  // rows per page
  const std::int64_t pages_per_seq = (L + rows - 1) / rows;
  const std::int64_t pool = std::int64_t(B) * pages_per_seq;
  const std::size_t cache_elems = std::size_t(pool) * rows * Hkv * D;
  __nv_bfloat16* k_cache = device_random_bf16(cache_elems, 11);
  __nv_bfloat16* v_cache = device_random_bf16(cache_elems, 12);
  __nv_bfloat16* q = device_random_bf16(std::size_t(B) * H * D, 13);
  __nv_bfloat16* out = nullptr;
  float* lse = nullptr;
  CHECK(cudaMalloc(&out, std::size_t(B) * H * D * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&lse, std::size_t(B) * H * sizeof(float)));
  std::int32_t* table = nullptr;
  if (page_size > 0) {
    std::vector<std::int32_t> host(static_cast<std::size_t>(pool));
    std::iota(host.begin(), host.end(), 0);
    std::shuffle(host.begin(), host.end(), gen);
    CHECK(cudaMalloc(&table, host.size() * sizeof(std::int32_t)));
    CHECK(cudaMemcpy(table, host.data(), host.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  }
  std::vector<std::int32_t> lens(std::size_t(B), L);
  std::int32_t* seqlens = nullptr;
  CHECK(cudaMalloc(&seqlens, lens.size() * sizeof(std::int32_t)));
  CHECK(cudaMemcpy(seqlens, lens.data(), lens.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  const std::size_t workspace_bytes =
      std::size_t(kv::kMaxSplits) * B * H * (D + 1) * sizeof(float) + 16;
  void* workspace = nullptr;
  CHECK(cudaMalloc(&workspace, workspace_bytes));

  KvCacheKernelParams k;
  k.q = q;
  k.out = out;
  k.lse = lse;
  k.q_rows = {std::int64_t(H) * D, std::int64_t(H) * D, D};
  k.out_rows = k.q_rows;
  k.lse_rows = {H, 1, 1};  // [B, H, 1]
  k.seqlen_q = 1;
  k.total_q = B;
  const std::int64_t row = std::int64_t(Hkv) * D;
  k.k = {k_cache, rows * row, row, D};
  if (opt.head_major) k.k = {k_cache, rows * row, D, rows * D};
  k.v = k.k;
  k.v.data = v_cache;
  k.block_table = table;
  k.table_batch = pages_per_seq;
  k.table_page = 1;
  k.cache_seqlens = seqlens;
  k.seqlens_stride = 1;
  k.page_size = rows;
  k.num_pages = page_size > 0 ? pool : B;
  k.capacity = pages_per_seq * rows;
  k.vector_loads = true;
  k.q_vector_loads = !opt.q_elements;
  k.batch = B;
  k.heads = H;
  k.kv_heads = Hkv;
  k.group = H / Hkv;
  k.head_dim = k.value_dim = D;
  k.row_tiles = (H / Hkv + kv::kRows - 1) / kv::kRows;
  k.scale = 1.0f / std::sqrt(float(D));
  k.has_upper = true;  // causal: the query is the last position
  k.upper = 0;

  const int bucket = kv::mma_bucket(D, D);
  const bool keys64 = opt.tile_keys == 64 && bucket == 64;
  const bool keys64_d256 = opt.tile_keys == 64 && bucket == 256;
  const bool keys32_d128 = opt.tile_keys == 32 && bucket == 128;
  const int tile_keys =
      keys64 || keys64_d256 ? 64 : (keys32_d128 ? 32 : kv::mma_tile_keys(bucket));
  const int row_tiles = keys64_d256   ? (k.row_tiles > 1 ? 2 : 1)
                        : keys32_d128 ? 2
                                      : kv::mma_row_tiles(k.row_tiles, bucket);
  // The library's launch on sm90 and newer: the combine overlaps the attention kernel's end.
  const bool overlap = dev.major >= 9 && !opt.plain_combine;
  Result results[2];
  for (int mma = opt.fast ? 1 : 0; mma < 2; ++mma) {
    int stages = 0, shared = 0, splits = 0;
    if (mma) {
      stages = opt.stages > 0 ? opt.stages
                              : kv::mma_stages(D, D, dev.max_shared, row_tiles, tile_keys,
                                               kv::mma_pair_limit(dev.shared_per_sm, dev.reserved));
      if (stages == 0) {
        std::fprintf(stderr, "the tensor-core kernel does not fit this device's shared memory\n");
        std::exit(1);
      }
      shared = kv::mma_layout(D, D, stages, row_tiles, tile_keys).total;
      int registers = 0;
      CHECK(kv::mma_registers(bucket, &registers));
      const int per_sm = kv::mma_blocks_per_sm(shared, dev.reserved, dev.shared_per_sm, registers,
                                               dev.registers_per_sm, dev.threads_per_sm);
      splits = opt.splits > 0 ? opt.splits
                              : kv::split_rule(kv::mma_grid_blocks(k, row_tiles), k.capacity,
                                               std::int64_t(dev.sms) * per_sm, tile_keys);
    } else {
      shared = kv::shared_layout(D, D, 2).total;
      splits = cuda_core_splits(dev, std::int64_t(B) * Hkv * k.row_tiles, k.capacity, shared);
    }
    k.num_splits = splits;
    const std::size_t part_rows = std::size_t(splits) * B * H;
    k.partial_out = static_cast<float*>(workspace);
    k.partial_lse = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) +
                                             (part_rows * D * sizeof(float) + 15) / 16 * 16);
    auto launch = [&] {
      if (mma && keys64) {
        if (row_tiles == 1) launch_variant<64, 1, 64>(k, stages, shared, overlap);
        else if (row_tiles == 2) launch_variant<64, 2, 64>(k, stages, shared, overlap);
        else launch_variant<64, 4, 64>(k, stages, shared, overlap);
        return;
      }
      if (mma && keys32_d128) {
        launch_variant<128, 2, 32>(k, stages, shared, overlap);
        return;
      }
      if (mma && keys64_d256) {
        if (row_tiles == 1) launch_variant<256, 1, 64>(k, stages, shared, overlap);
        else launch_variant<256, 2, 64>(k, stages, shared, overlap);
        return;
      }
      const cudaError_t e = kv::launch_attention<__nv_bfloat16>(k, stages, shared, 0, overlap);
      if (e != cudaSuccess) {
        std::fprintf(stderr, "launch failed: %s\n", cudaGetErrorString(e));
        std::exit(1);
      }
    };
    CHECK(cudaMemset(out, 0xff, std::size_t(B) * H * D * sizeof(__nv_bfloat16)));  // NaN
    const std::vector<float> ms = sorted_launch_ms(launch, kTimedRuns);
    CHECK(cudaDeviceSynchronize());
    Result& r = results[mma];
    r.ms = ms[kTimedRuns / 2];
    if (mma && splits > 1) {  // the combine alone, on the partials the last run left
      const auto combine = [&] { CHECK(kv::launch_combine<__nv_bfloat16>(k, nullptr, overlap)); };
      r.combine_ms = sorted_launch_ms(combine, kTimedRuns)[kTimedRuns / 2];
      // Without the flush: its partials in L2, as a decode's combine finds them after the kernel
      // that wrote them.
      r.combine_hot_ms = sorted_launch_ms(combine, kTimedRuns, 0, /*flush_l2=*/false)[kTimedRuns / 2];
    }
    r.splits = splits;
    r.stages = stages;
    r.out.resize(std::size_t(B) * H * D);
    r.lse.resize(std::size_t(B) * H);
    CHECK(cudaMemcpy(r.out.data(), out, r.out.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(r.lse.data(), lse, r.lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }

  double largest = 0.0, out_diff = 0.0, lse_diff = 0.0;
  bool finite = true;
  const Result& ref = results[opt.fast ? 1 : 0];
  for (std::size_t i = 0; i < results[1].out.size(); ++i) {
    const double a = __bfloat162float(ref.out[i]), b = __bfloat162float(results[1].out[i]);
    finite = finite && std::isfinite(a) && std::isfinite(b);
    largest = std::max(largest, std::fabs(a));
    out_diff = std::max(out_diff, std::fabs(a - b));
  }
  for (std::size_t i = 0; i < results[1].lse.size(); ++i) {
    finite = finite && std::isfinite(ref.lse[i]) && std::isfinite(results[1].lse[i]);
    lse_diff = std::max(lse_diff, double(std::fabs(ref.lse[i] - results[1].lse[i])));
  }
  const bool ok = finite && out_diff <= 2e-2 * largest && lse_diff <= 2e-2;
  const double bytes = double(B) * L * Hkv * (D + D) * sizeof(__nv_bfloat16);
  const double new_tbs = bytes / (results[1].ms * 1e9);
  char shape[64];
  std::snprintf(shape, sizeof(shape), "%d/%d D%d B%d L%d %s", H, Hkv, D, B, L,
                page_size > 0 ? ("page" + std::to_string(page_size)).c_str() : "contig");
  std::printf("%-34s |", shape);
  if (!opt.fast) {
    std::printf(" cuda-core %7.3f ms (%2d splits) |", results[0].ms, results[0].splits);
  }
  std::printf(" mma %7.3f ms %5.2f TB/s = %3.0f%% of copy (%2d splits, %d stages, %d keys, %d row tiles)",
              results[1].ms, new_tbs, 100.0 * new_tbs / copy_tbs, results[1].splits,
              results[1].stages, tile_keys, row_tiles);
  if (results[1].combine_ms > 0.0f) {
    std::printf(" [combine %.3f ms, %.3f with its partials in L2]", results[1].combine_ms,
                results[1].combine_hot_ms);
  }
  if (!opt.fast) std::printf(" | %5.2fx | out diff %.2e, lse diff %.2e", results[0].ms / results[1].ms, out_diff, lse_diff);
  std::printf(" %s\n", ok ? "ok" : "MISMATCH");
  std::fflush(stdout);

  CHECK(cudaFree(k_cache));
  CHECK(cudaFree(v_cache));
  CHECK(cudaFree(q));
  CHECK(cudaFree(out));
  CHECK(cudaFree(lse));
  if (table != nullptr) CHECK(cudaFree(table));
  CHECK(cudaFree(seqlens));
  CHECK(cudaFree(workspace));
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  Options opt;
  std::vector<Case> cases;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    Case c;
    if (arg == "quick") {
      quick = true;
    } else if (arg == "fast") {
      opt.fast = true;
    } else if (arg == "plain_combine") {
      opt.plain_combine = true;
    } else if (arg == "head_major") {
      opt.head_major = true;
    } else if (arg == "q_elements") {
      opt.q_elements = true;
    } else if (arg.substr(0, 7) == "splits=") {
      opt.splits = std::atoi(argv[i] + 7);
    } else if (arg.substr(0, 7) == "stages=") {
      opt.stages = std::atoi(argv[i] + 7);
    } else if (arg.substr(0, 10) == "tile_keys=") {
      opt.tile_keys = std::atoi(argv[i] + 10);
    } else if (arg.substr(0, 5) == "case=" &&
               std::sscanf(argv[i] + 5, "%d,%d,%d,%d,%d,%d", &c.B, &c.L, &c.H, &c.Hkv, &c.D,
                           &c.page) == 6) {
      cases.push_back(c);
    } else {
      std::fprintf(stderr,
                   "usage: %s [quick] [fast] [q_elements] [head_major] [plain_combine] [splits=N] [stages=N] [tile_keys=32|64] "
                   "[case=B,L,H,Hkv,D,page ...]\n",
                   argv[0]);
      return 2;
    }
  }
  if (cases.empty()) {
    for (int B : {1, 8}) {
      for (int L : {4096, 32768, 131072}) {
        if (quick && !((B == 1 && L == 131072) || (B == 8 && L == 32768))) continue;
        for (int page_size : {0, 16, 64, 256}) {
          if (quick && page_size != 0 && page_size != 64) continue;
          cases.push_back({B, L, 32, 8, 128, page_size});
        }
      }
    }
  }
  const Device dev = query_device();
  CHECK(kv::allow_mma_shared<__nv_bfloat16>(dev.max_shared));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const double copy_tbs = copy_bandwidth_tbs();
  std::printf("%s, %d SMs; device-to-device copy %.2f TB/s; bf16 decode (Lq 1), H/Hkv\n", prop.name,
              dev.sms, copy_tbs);
  bool ok = true;
  for (const Case& c : cases) ok = run_case(dev, c, opt, copy_tbs) && ok;
  std::printf("%s\n", ok ? "all cases agree" : "MISMATCH between the kernels");
  return ok ? 0 : 1;
}
