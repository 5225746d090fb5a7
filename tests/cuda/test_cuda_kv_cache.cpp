// Attention over a KV cache on CUDA (SPEC §16) against the float64 oracle of tests/kv_cache_case.h
// (dense attention of each sequence over exactly its keys). Cache rows past each sequence's length
// and unused pages hold NaN, outputs are poisoned with NaN; paged == contiguous bitwise at the same
// split count; split counts 1, several and the library's choice; the append; bad device block tables
// and lengths (clamped: no fault, run under compute-sanitizer); capture into a CUDA graph.
// Every case runs under each attention kernel (a test parameter, override_kv_cache_kernel for the
// whole test): the decode kernels on tensor cores and on CUDA cores, and the dense sm90 forward
// (FMHA_KV_CACHE_KERNEL=forward; where it does not apply, the tensor-core kernel).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/cuda_device_copy.h"
#include "cuda/cuda_forward_case.h"
#include "cuda/kv_cache_backend.h"
#include "kv_cache_case.h"

namespace fmha_cuda_test {
namespace {

using fmha_test::HostTensor;
using fmha_test::KvCase;
using fmha_test::KvCaseData;
using fmha::cuda::KvCacheKernel;

#define SKIP_WITHOUT_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present"

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) {
    if (bytes > 0) {
      EXPECT_EQ(cudaMalloc(&data_, bytes), cudaSuccess);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
};

// The case's call on device copies of its buffers.
fmha::KvCacheForwardParams upload(KvCaseData& data, DeviceCopies& copies) {
  fmha::KvCacheForwardParams p = data.params();  // poisons out and lse first
  p.q = copies.upload(data.q);
  p.cu_seqlens_q = copies.upload(data.cu_seqlens_q);
  p.k_cache = copies.upload(data.k_cache);
  p.v_cache = copies.upload(data.v_cache);
  p.block_table = copies.upload(data.block_table);
  p.cache_seqlens = copies.upload(data.cache_seqlens);
  p.out = copies.upload(data.out);
  p.lse = copies.upload(data.lse);
  p.options.sinks = copies.upload(data.sinks);
  return p;
}

std::string describe(const KvCase& c, int splits) {
  std::ostringstream s;
  s << fmha::to_string(c.dtype) << " H" << c.heads << "/" << c.kv_heads << " D" << c.head_dim
    << " Dv" << c.value_dim << " page " << c.page_size << " splits " << splits << " lens";
  for (int n : c.cache_lens) s << ' ' << n;
  if (c.packed()) {
    s << " q_lens";
    for (int n : c.q_lens) s << ' ' << n;
  } else {
    s << " Lq " << c.seqlen_q;
  }
  s << (c.options.causal ? " causal" : "") << " window " << c.options.window_left << ","
    << c.options.window_right << (c.options.softcap > 0 ? " softcap" : "") << (c.sinks ? " sinks" : "");
  return s.str();
}

// Runs the case on the GPU with `splits` (0: the library's choice, with the workspace it asks for)
// and checks out / lse against the oracle. Returns the data holding the GPU's results.
KvCaseData run_case(const KvCase& c, int splits, std::uint64_t seed) {
  SCOPED_TRACE(describe(c, splits));
  KvCaseData data(c, seed);
  DeviceCopies copies;
  fmha::KvCacheForwardParams p = upload(data, copies);
  p.num_splits = splits;
  std::size_t bytes = 0;
  fmha::Status status = fmha::workspace_size(p, &bytes);
  EXPECT_TRUE(status.ok()) << status.message();
  DeviceBuffer workspace(bytes);
  p.workspace = workspace.get();
  p.workspace_bytes = bytes;
  status = fmha::run(p);
  EXPECT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  DeviceCopies::download(data.out, p.out);
  if (data.lse.defined()) DeviceCopies::download(data.lse, p.lse);
  std::vector<double> out_ref, lse_ref, out_lowp;
  data.reference(&out_ref, &lse_ref, &out_lowp);
  const double tol = fmha_test::kv_tolerance(c.dtype, out_ref, out_lowp);
  EXPECT_TRUE(fmha_test::close("out", data.out.to_double(), out_ref, data.out.shape(), tol));
  if (c.lse) {
    EXPECT_TRUE(fmha_test::close("lse", data.lse.to_double(), lse_ref, data.lse.shape(), 2e-5));
  }
  return data;
}

// Contiguous and every page size give bitwise the same result at the same split count (with the
// library's choice, 0, the counts may differ: the rule sees each layout's capacity).
void check_layouts(KvCase c, int splits, std::uint64_t seed, std::initializer_list<std::int64_t> pages) {
  c.page_size = 0;
  const KvCaseData contiguous = run_case(c, splits, seed);
  for (std::int64_t page_size : pages) {
    c.page_size = page_size;
    const KvCaseData paged = run_case(c, splits, seed);
    if (splits == 0) continue;
    EXPECT_TRUE(paged.out.bitwise_equal(contiguous.out)) << describe(c, splits);
    if (c.lse) {
      EXPECT_TRUE(paged.lse.bitwise_equal(contiguous.lse)) << describe(c, splits);
    }
  }
}

// The suite, once per attention kernel: the parameter is forced for the whole test.
class CudaKvCache : public ::testing::TestWithParam<KvCacheKernel> {
 protected:
  void SetUp() override {
    const KvCacheKernel kernel = GetParam();
    fmha::cuda::override_kv_cache_kernel(&kernel);
  }
  void TearDown() override { fmha::cuda::override_kv_cache_kernel(nullptr); }
};

INSTANTIATE_TEST_SUITE_P(Kernels, CudaKvCache,
                         ::testing::Values(KvCacheKernel::kCudaCores, KvCacheKernel::kTensorCores,
                                           KvCacheKernel::kForward),
                         [](const ::testing::TestParamInfo<KvCacheKernel>& info) {
                           switch (info.param) {
                             case KvCacheKernel::kCudaCores: return std::string("CudaCores");
                             case KvCacheKernel::kTensorCores: return std::string("TensorCores");
                             default: return std::string("Forward");
                           }
                         });

KvCase decode_case(DType dtype, std::int64_t heads, std::int64_t kv_heads, std::int64_t dim) {
  KvCase c;
  c.dtype = dtype;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = dim;
  c.value_dim = dim;
  c.cache_lens = {1, 300, 0, 77, 1025};
  c.options.causal = true;
  return c;
}

TEST_P(CudaKvCache, DecodeHeadGroupsAndDims) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 1;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (auto [heads, kv_heads] : {std::pair{8, 2}, std::pair{8, 1}, std::pair{4, 4}, std::pair{32, 8}})
      for (std::int64_t dim : {64, 128}) check_layouts(decode_case(dtype, heads, kv_heads, dim), 0, ++seed, {16});
}

// Groups of more than 16 rows a kv head: MQA 32/1 at Lq 1 (two row tiles, one block), a group of
// 24 (a second, partial tile), a group of 8 over 3 query tokens, and 5 tokens of a group of 16 at
// D 256 (five row tiles: a block takes two there), each contiguous and paged, with splits.
TEST_P(CudaKvCache, LargeGroupsShareTheirKeys) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 700;
  for (std::int64_t dim : {64, 128}) {
    KvCase c = decode_case(DType::kBFloat16, 32, 1, dim);
    for (int splits : {1, 4, 0}) check_layouts(c, splits, ++seed, {16});
  }
  KvCase c = decode_case(DType::kFloat16, 24, 1, 96);
  for (int splits : {1, 0}) check_layouts(c, splits, ++seed, {64});
  c = decode_case(DType::kBFloat16, 16, 2, 128);
  c.seqlen_q = 3;
  c.options.window_left = 200;
  for (int splits : {1, 3}) check_layouts(c, splits, ++seed, {16});
  c = decode_case(DType::kBFloat16, 16, 1, 256);
  c.seqlen_q = 5;
  c.sinks = true;
  for (int splits : {1, 0}) check_layouts(c, splits, ++seed, {64});
}

TEST_P(CudaKvCache, OddDimsAndPageSizes) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (auto [dim, value_dim] : {std::pair{17, 17}, std::pair{40, 24}, std::pair{256, 256}, std::pair{96, 200}}) {
    KvCase c = decode_case(DType::kBFloat16, 6, 2, dim);
    c.value_dim = value_dim;
    for (int splits : {1, 3, 0}) check_layouts(c, splits, ++seed, {1, 7, 64, 256});
  }
}

TEST_P(CudaKvCache, ShortQueriesEveryOption) {
  SKIP_WITHOUT_GPU();
  KvCase base = decode_case(DType::kFloat16, 6, 3, 64);
  base.cache_lens = {0, 3, 170, 40, 9};
  base.seqlen_q = 5;
  std::uint64_t seed = 200;
  for (int feature = 0; feature < 7; ++feature) {
    KvCase c = base;
    c.options = {};
    switch (feature) {
      case 0: break;
      case 1: c.options.causal = true; break;
      case 2: c.options.window_left = 40; c.options.window_right = 0; break;
      case 3: c.options.causal = true; c.options.window_left = 2; break;
      case 4: c.options.window_left = 30; c.options.window_right = 2; break;
      case 5: c.options.softcap = 2.5f; c.options.scale = 0.7f; c.options.causal = true; break;
      case 6: c.sinks = true; c.options.causal = true; break;
    }
    for (int splits : {1, 4}) check_layouts(c, splits, ++seed, {16});
  }
}

// Long caches: many key tiles through the copy pipeline (every stage of the ring reused), splits
// that start mid-page, lengths one past a tile and a page.
TEST_P(CudaKvCache, LongCachesManyTiles) {
  SKIP_WITHOUT_GPU();
  KvCase c = decode_case(DType::kBFloat16, 32, 8, 128);
  c.cache_lens = {5000, 4097, 64, 65};
  for (int splits : {1, 7, 0}) check_layouts(c, splits, 350 + splits, {16, 256});
  c = decode_case(DType::kFloat16, 8, 2, 64);
  c.cache_lens = {3001, 1};
  c.seqlen_q = 3;
  c.options.window_left = 700;
  for (int splits : {1, 5}) check_layouts(c, splits, 360 + splits, {7, 64});
}

// One kv head at B 1 over a long cache: the split rule at its cap (kMaxSplits, one block a split),
// and a caller's 100 splits (clamped to the cap); the combine merges as many parts as it takes.
TEST_P(CudaKvCache, ManySplitsOfOneHead) {
  SKIP_WITHOUT_GPU();
  KvCase c = decode_case(DType::kBFloat16, 32, 1, 128);
  c.cache_lens = {20000};
  c.sinks = true;
  for (int splits : {0, 100}) check_layouts(c, splits, 380 + splits, {16});
  // The most splits (asking for more gets kMaxSplits, 256), some a single tile, at the widest head:
  // the combine's quarters of the splits and its columns up to 255.
  c = decode_case(DType::kFloat16, 32, 1, 256);
  c.cache_lens = {9000};
  for (int splits : {0, 300}) check_layouts(c, splits, 390 + splits, {64});
  // Dv not a multiple of 4: the block-a-row combine's scalar loads instead of float4.
  c = decode_case(DType::kBFloat16, 16, 1, 64);
  c.value_dim = 90;
  c.cache_lens = {5000};
  check_layouts(c, 100, 399, {16});
}

TEST_P(CudaKvCache, PackedQueriesChunkedPrefill) {
  SKIP_WITHOUT_GPU();
  KvCase c = decode_case(DType::kBFloat16, 8, 2, 128);
  c.cache_lens = {90, 4, 7, 0, 300};
  c.q_lens = {20, 0, 7, 1, 33};
  c.sinks = true;
  for (int splits : {1, 5, 0}) check_layouts(c, splits, 300 + splits, {16, 64});
}

// Prefill-sized calls (the default runs them on the sm90 forward): query runs of more than one
// 128-row tile over caches of different lengths, dense and packed, GQA, every option, D 64 / 128 /
// 256 and a Dv of its own, contiguous and paged (pages of 16 and 256, and of 7: a page size that
// is no power of two, and pages that end inside a key tile).
TEST_P(CudaKvCache, PrefillOverCaches) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 800;
  KvCase base = decode_case(DType::kBFloat16, 8, 2, 128);
  base.cache_lens = {700, 150, 0, 333};
  base.seqlen_q = 150;
  for (int feature = 0; feature < 5; ++feature) {
    KvCase c = base;
    c.options = {};
    switch (feature) {
      case 0: c.options.causal = true; break;
      case 1: break;
      case 2: c.options.window_left = 100; c.options.window_right = 0; break;
      case 3: c.options.softcap = 20.0f; c.options.causal = true; c.lse = true; break;
      case 4: c.sinks = true; c.options.causal = true; c.lse = true; break;
    }
    check_layouts(c, 1, ++seed, {16, 256});
  }
  KvCase c = base;
  c.dtype = DType::kFloat16;
  c.cache_lens = {260, 1, 515};
  c.seqlen_q = 0;
  c.q_lens = {200, 1, 131};
  c.lse = true;
  check_layouts(c, 1, ++seed, {7, 64});
  for (auto [dim, value_dim] : {std::pair{64, 64}, std::pair{256, 256}, std::pair{128, 96}}) {
    c = base;
    c.head_dim = dim;
    c.value_dim = value_dim;
    c.heads = 4;
    c.kv_heads = 1;
    check_layouts(c, 1, ++seed, {16});
  }
}

// Dense queries over pages that the sm90 forward copies by TMA, a page's box at a time (up to a key
// tile's share of one): pages smaller than a key tile (8, 16, 32), as long as one (64 at D 256, 128
// at D 64 / 128), longer (256: two key tiles of D 64 / 128 a page, four of D 256); caches of whole
// key tiles only and with a partial last tile (copied by cp.async: its stale rows are NaN); a window
// whose key tiles start inside a page of 128 (the gather takes those) but on a page boundary of 64;
// Dv != D (the value map's columns past Dv come back as zeros).
TEST_P(CudaKvCache, PrefillInPageBoxes) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 900;
  KvCase base = decode_case(DType::kBFloat16, 4, 2, 128);
  base.seqlen_q = 150;
  base.cache_lens = {700, 256, 512, 150};
  base.options = {};
  base.options.causal = true;
  check_layouts(base, 1, ++seed, {8, 32, 128, 256});
  KvCase c = base;
  c.options = {};
  c.options.window_left = 100;
  c.options.window_right = 0;
  check_layouts(c, 1, ++seed, {64, 128});
  c = base;
  c.head_dim = 256;
  c.value_dim = 256;
  check_layouts(c, 1, ++seed, {8, 64, 256});
  c = base;
  c.head_dim = 64;
  c.value_dim = 40;
  c.dtype = DType::kFloat16;
  check_layouts(c, 1, ++seed, {16, 256});
}

TEST_P(CudaKvCache, EmptyCachesAndWorkspaceFallback) {
  SKIP_WITHOUT_GPU();
  KvCase c = decode_case(DType::kFloat16, 4, 2, 64);
  c.cache_lens = {0, 0};
  c.seqlen_q = 2;
  run_case(c, 0, 400);
  c.sinks = true;
  run_case(c, 3, 401);
  // A long cache wants splits; without a workspace the call runs unsplit, still correct.
  c = decode_case(DType::kFloat16, 4, 2, 64);
  c.cache_lens = {4000};
  c.page_size = 16;
  KvCaseData data(c, 402);
  DeviceCopies copies;
  fmha::KvCacheForwardParams p = upload(data, copies);
  std::size_t bytes = 0;
  ASSERT_TRUE(fmha::workspace_size(p, &bytes).ok());
  if (GetParam() != KvCacheKernel::kForward) {  // the forward does not split keys
    EXPECT_GT(bytes, 0u) << "a single 4000-key sequence should be split";
  }
  ASSERT_TRUE(fmha::run(p).ok());
  DeviceCopies::download(data.out, p.out);
  std::vector<double> out_ref, lse_ref, out_lowp;
  data.reference(&out_ref, &lse_ref, &out_lowp);
  EXPECT_TRUE(fmha_test::close("out", data.out.to_double(), out_ref, data.out.shape(),
                               fmha_test::kv_tolerance(c.dtype, out_ref, out_lowp)));
}

// Bad block tables and lengths in device memory are not read by the host; the kernels clamp them.
// Nothing is checked of the numbers, only that nothing faults (compute-sanitizer memcheck: no access
// outside the tensors).
TEST_P(CudaKvCache, BadDeviceTablesAreClamped) {
  SKIP_WITHOUT_GPU();
  KvCase c = decode_case(DType::kFloat16, 8, 2, 64);
  c.page_size = 16;
  KvCaseData data(c, 500);
  const std::int64_t max_pages = data.block_table.shape()[1];
  data.block_table.set(1 * max_pages + 2, 1e6);
  data.block_table.set(4 * max_pages + 0, -7);
  data.cache_seqlens.set(3, 1e6);
  data.cache_seqlens.set(0, -5);
  DeviceCopies copies;
  // params() on host data would be refused; the device copies are not read by the host.
  fmha::KvCacheForwardParams p = data.params();
  p.q = copies.upload(data.q);
  p.k_cache = copies.upload(data.k_cache);
  p.v_cache = copies.upload(data.v_cache);
  p.block_table = copies.upload(data.block_table);
  p.cache_seqlens = copies.upload(data.cache_seqlens);
  p.out = copies.upload(data.out);
  p.lse = copies.upload(data.lse);
  for (int splits : {1, 4}) {
    p.num_splits = splits;
    DeviceBuffer workspace(1 << 20);
    p.workspace = workspace.get();
    p.workspace_bytes = 1 << 20;
    const fmha::Status status = fmha::run(p);
    EXPECT_TRUE(status.ok()) << status.message();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // The append skips out-of-range writes.
  HostTensor k_new(c.dtype, {c.batch(), 2, c.kv_heads, c.head_dim});
  HostTensor v_new(c.dtype, {c.batch(), 2, c.kv_heads, c.value_dim});
  const fmha::KvCacheAppendParams append{.k_new = copies.upload(k_new),
                                         .v_new = copies.upload(v_new),
                                         .cu_seqlens_new = {},
                                         .k_cache = p.k_cache,
                                         .v_cache = p.v_cache,
                                         .block_table = p.block_table,
                                         .cache_seqlens = p.cache_seqlens};
  EXPECT_TRUE(fmha::run(append).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Append on the device, then attend: the same result as the case whose cache held the tokens.
TEST_P(CudaKvCache, AppendThenAttend) {
  SKIP_WITHOUT_GPU();
  for (std::int64_t page_size : {0, 16}) {
    KvCase full = decode_case(DType::kBFloat16, 8, 2, 64);
    full.page_size = page_size;
    full.cache_lens = {8, 3, 40, 300};
    const std::vector<std::int32_t> old_lens = {5, 0, 37, 297};
    const KvCaseData expected = run_case(full, 2, 600);
    KvCaseData data(full, 600);
    const std::int64_t B = full.batch(), Hkv = full.kv_heads, D = full.head_dim, Dv = full.value_dim;
    HostTensor k_new(full.dtype, {B, 3, Hkv, D}), v_new(full.dtype, {B, 3, Hkv, Dv});
    for (std::int64_t b = 0; b < B; ++b) {
      data.cache_seqlens.set(b, old_lens[static_cast<std::size_t>(b)]);
      for (std::int64_t n = 0; n < 3; ++n) {
        const std::int64_t row = data.cache_row(b, old_lens[static_cast<std::size_t>(b)] + n);
        for (std::int64_t e = 0; e < Hkv * D; ++e) {
          k_new.set((b * 3 + n) * Hkv * D + e, expected.k_cache.at(row * Hkv * D + e));
          data.k_cache.set(row * Hkv * D + e, std::nan(""));
        }
        for (std::int64_t e = 0; e < Hkv * Dv; ++e) {
          v_new.set((b * 3 + n) * Hkv * Dv + e, expected.v_cache.at(row * Hkv * Dv + e));
          data.v_cache.set(row * Hkv * Dv + e, std::nan(""));
        }
      }
    }
    DeviceCopies copies;
    fmha::KvCacheForwardParams p = upload(data, copies);
    const fmha::KvCacheAppendParams append{.k_new = copies.upload(k_new),
                                           .v_new = copies.upload(v_new),
                                           .cu_seqlens_new = {},
                                           .k_cache = p.k_cache,
                                           .v_cache = p.v_cache,
                                           .block_table = p.block_table,
                                           .cache_seqlens = p.cache_seqlens};
    ASSERT_TRUE(fmha::run(append).ok());
    for (std::int64_t b = 0; b < B; ++b) data.cache_seqlens.set(b, full.cache_lens[static_cast<std::size_t>(b)]);
    p.cache_seqlens = copies.upload(data.cache_seqlens);
    p.num_splits = 2;
    DeviceBuffer workspace(1 << 20);
    p.workspace = workspace.get();
    p.workspace_bytes = 1 << 20;
    ASSERT_TRUE(fmha::run(p).ok());
    DeviceCopies::download(data.out, p.out);
    EXPECT_TRUE(data.out.bitwise_equal(expected.out)) << "page_size " << page_size;
  }
}

// A paged decode call captured into a CUDA graph and replayed gives the eager call's result.
TEST_P(CudaKvCache, CudaGraphCapture) {
  SKIP_WITHOUT_GPU();
  KvCase c = decode_case(DType::kBFloat16, 8, 2, 128);
  c.page_size = 64;
  KvCaseData data(c, 700);
  TestStream stream;
  DeviceCopies copies;
  fmha::KvCacheForwardParams p = upload(data, copies);
  std::size_t bytes = 0;
  ASSERT_TRUE(fmha::workspace_size(p, &bytes).ok());
  DeviceBuffer workspace(bytes);
  p.workspace = workspace.get();
  p.workspace_bytes = bytes;
  ASSERT_TRUE(fmha::run(p, stream.get()).ok());  // first call: device properties cached here
  ASSERT_EQ(stream.sync(), cudaSuccess);
  HostTensor eager = data.out;
  DeviceCopies::download(eager, p.out);
  ASSERT_EQ(fmha_cuda_test::fill_device(p.out.data, 0xff, fmha_cuda_test::storage_bytes(p.out)),
            cudaSuccess);
  const auto s = static_cast<cudaStream_t>(stream.get());
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  const fmha::Status status = fmha::run(p, stream.get());
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_TRUE(status.ok()) << status.message();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(stream.sync(), cudaSuccess);
  DeviceCopies::download(data.out, p.out);
  EXPECT_TRUE(data.out.bitwise_equal(eager));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace fmha_cuda_test
