// Neighborhood attention forward on CUDA (SPEC §6) against the CPU reference: fmha::run on float64
// copies of the same inputs, within SPEC §13's bound (2 x the error of the naive same-dtype
// computation + 1e-4). 1-D, 2-D and 3-D grids, odd and even kernels, dilation that does not divide
// the grid, kernel = grid, per-axis causality, extra keys, sinks, softcap, scale, bias and rel-pos
// over the flattened grid, GQA, head dims 32..128, permuted / padded / broadcast layouts; outputs
// poisoned with NaN and padded so that unwritten or out-of-view elements fail.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/cuda_device_copy.h"
#include "cuda/cuda_forward_case.h"
#include "test_case.h"

namespace fmha_cuda_test {
namespace {

using fmha_test::AttentionCase;
using fmha_test::CaseTensors;
using fmha_test::HostTensor;
using fmha_test::Storage;

#define SKIP_WITHOUT_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present"

AttentionCase na_case(DType dtype, int dims, std::array<std::int64_t, 3> grid,
                      std::array<std::int64_t, 3> kernel, std::array<std::int64_t, 3> dilation,
                      std::array<bool, 3> causal = {false, false, false}) {
  AttentionCase c;
  c.kind = fmha_test::Kind::kNeighborhood;
  c.dtype = dtype;
  c.batch = 2;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 64;
  c.value_dim = 64;
  c.grid = grid;
  c.neighborhood = {
      .num_dims = dims, .kernel_size = kernel, .dilation = dilation, .causal = causal};
  c.backward = false;
  return c;
}

HostTensor float64_copy(const HostTensor& h) {
  if (!h.defined()) return {};
  HostTensor r(DType::kFloat64, h.shape());
  r.from_double(h.to_double());
  return r;
}

// The device views of a case's tensors, with the options' tensor fields filled in.
struct DeviceCase {
  DeviceCopies copies;
  fmha::TensorView q, k, v, out, lse;
  fmha::AttentionOptions options;

  DeviceCase(const AttentionCase& c, CaseTensors& t) {
    q = copies.upload(t.q);
    k = copies.upload(t.k);
    v = copies.upload(t.v);
    out = copies.upload(t.out);
    lse = copies.upload(t.lse);
    options = c.options;
    options.bias = copies.upload(t.bias);
    options.rel_h = copies.upload(t.rel_h);
    options.rel_w = copies.upload(t.rel_w);
    options.sinks = copies.upload(t.sinks);
    options.extra_k = copies.upload(t.extra_k);
    options.extra_v = copies.upload(t.extra_v);
  }
  fmha::NeighborhoodForwardParams params(const AttentionCase& c) const {
    return {.q = q,
            .k = k,
            .v = v,
            .out = out,
            .lse = lse,
            .neighborhood = c.neighborhood,
            .options = options};
  }
};

void check_na(const AttentionCase& c, std::uint64_t seed) {
  SCOPED_TRACE("case: " + c.describe() + " seed=" + std::to_string(seed));
  CaseTensors t = fmha_test::make_tensors(c, seed);

  // Reference: the CPU backend on float64 copies (sinks and lse stay fp32, as fp64 problems allow).
  AttentionCase c64 = c;
  c64.dtype = DType::kFloat64;
  c64.fp32_stats = true;
  CaseTensors r;
  for (auto [from, to] : {std::pair{&t.q, &r.q},
                          {&t.k, &r.k},
                          {&t.v, &r.v},
                          {&t.bias, &r.bias},
                          {&t.rel_h, &r.rel_h},
                          {&t.rel_w, &r.rel_w},
                          {&t.extra_k, &r.extra_k},
                          {&t.extra_v, &r.extra_v},
                          {&t.out, &r.out}}) {
    *to = float64_copy(*from);
  }
  r.sinks = t.sinks;
  r.lse = HostTensor(DType::kFloat32, t.lse.shape());
  const fmha::Status rs = fmha_test::run_forward(c64, r);
  ASSERT_TRUE(rs.ok()) << "CPU reference refused: " << rs.message();

  t.out.poison();
  t.lse.poison();
  DeviceCase dev(c, t);
  if (::testing::Test::HasFailure()) return;
  TestStream stream;
  const fmha::Status gs = fmha::run(dev.params(c), stream.get());
  const cudaError_t synced = stream.sync();
  ASSERT_TRUE(gs.ok()) << "CUDA neighborhood forward refused: " << gs.message();
  ASSERT_EQ(synced, cudaSuccess) << cudaGetErrorString(synced);
  DeviceCopies::download(t.out, dev.out);
  DeviceCopies::download(t.lse, dev.lse);

  const naive::Forward lowp =
      naive::forward(fmha_test::naive_problem(c, t), fmha_test::naive_rounding(c.dtype));
  const std::vector<double> ref_out = r.out.to_double(), ref_lse = r.lse.to_double();
  const double out_tol = fmha_test::tolerance(c.dtype, ref_out, lowp.out, c.dtype);
  const double lse_tol = fmha_test::tolerance(
      c.dtype, ref_lse, fmha_test::lse_to_library(c, lowp.lse), DType::kFloat32);
  EXPECT_TRUE(fmha_test::close("out", t.out.to_double(), ref_out, t.out.shape(), out_tol));
  EXPECT_TRUE(t.out.padding_untouched()) << "out: an element outside the view was written";
  EXPECT_TRUE(fmha_test::close("lse", t.lse.to_double(), ref_lse, t.lse.shape(), lse_tol));
}

TEST(CudaNeighborhoodSmall, OneDim) {
  SKIP_WITHOUT_GPU();
  check_na(na_case(DType::kFloat16, 1, {13, 1, 1}, {3, 1, 1}, {1, 1, 1}), 1);
  check_na(na_case(DType::kBFloat16, 1, {13, 1, 1}, {4, 1, 1}, {1, 1, 1}), 2);  // even kernel
  check_na(na_case(DType::kFloat16, 1, {13, 1, 1}, {3, 1, 1}, {3, 1, 1}), 3);   // 13 % 3 != 0
  check_na(na_case(DType::kBFloat16, 1, {14, 1, 1}, {2, 1, 1}, {4, 1, 1}), 4);
  check_na(na_case(DType::kFloat16, 1, {13, 1, 1}, {5, 1, 1}, {2, 1, 1}, {true, false, false}), 5);
  check_na(na_case(DType::kFloat16, 1, {11, 1, 1}, {11, 1, 1}, {1, 1, 1}), 6);  // kernel = grid
}

TEST(CudaNeighborhoodSmall, TwoAndThreeDim) {
  SKIP_WITHOUT_GPU();
  check_na(na_case(DType::kFloat16, 2, {7, 9, 1}, {3, 5, 1}, {1, 1, 1}), 11);
  check_na(na_case(DType::kBFloat16, 2, {7, 9, 1}, {2, 4, 1}, {2, 2, 1}), 12);
  check_na(na_case(DType::kFloat16, 2, {8, 7, 1}, {3, 2, 1}, {2, 3, 1}, {true, false, false}), 13);
  check_na(na_case(DType::kBFloat16, 2, {5, 6, 1}, {2, 3, 1}, {2, 1, 1}, {true, true, false}), 14);
  check_na(na_case(DType::kFloat16, 3, {4, 5, 6}, {3, 2, 3}, {1, 2, 2}), 15);
  check_na(na_case(DType::kBFloat16, 3, {5, 4, 5}, {2, 3, 2}, {2, 1, 2}, {true, false, true}), 16);
}

TEST(CudaNeighborhood, OneDimLong) {
  SKIP_WITHOUT_GPU();
  // Many query blocks and key tiles: full tiles (1-D without dilation) and partial ones.
  check_na(na_case(DType::kFloat16, 1, {1000, 1, 1}, {7, 1, 1}, {1, 1, 1}), 21);
  check_na(na_case(DType::kBFloat16, 1, {1000, 1, 1}, {130, 1, 1}, {1, 1, 1}), 22);
  check_na(na_case(DType::kFloat16, 1, {999, 1, 1}, {64, 1, 1}, {1, 1, 1}, {true, false, false}),
           23);
  check_na(na_case(DType::kBFloat16, 1, {577, 1, 1}, {9, 1, 1}, {5, 1, 1}), 24);
  check_na(na_case(DType::kFloat16, 1, {300, 1, 1}, {300, 1, 1}, {1, 1, 1}), 25);  // dense
}

// One long axis without dilation runs as a window that shifts at the borders on the dense
// kernels (neighborhood.cu): windows close to the grid (shift over most rows), odd and even, a
// 2-D grid with one axis of size 1, and the features that run beside the mask.
TEST(CudaNeighborhood, OneAxisWindows) {
  SKIP_WITHOUT_GPU();
  check_na(na_case(DType::kBFloat16, 1, {1000, 1, 1}, {999, 1, 1}, {1, 1, 1}), 26);
  check_na(na_case(DType::kFloat16, 1, {1000, 1, 1}, {998, 1, 1}, {1, 1, 1}), 27);
  check_na(na_case(DType::kBFloat16, 1, {777, 1, 1}, {255, 1, 1}, {1, 1, 1}), 28);
  check_na(na_case(DType::kFloat16, 2, {1, 517, 1}, {1, 130, 1}, {1, 1, 1}), 29);
  check_na(na_case(DType::kBFloat16, 3, {1, 1, 300}, {1, 1, 17}, {1, 1, 1}, {false, false, true}),
           30);
  AttentionCase c = na_case(DType::kBFloat16, 1, {613, 1, 1}, {201, 1, 1}, {1, 1, 1});
  c.extra = 5;
  c.sinks = true;
  c.options.softcap = 10.0f;
  c.bias.given = true;
  c.heads = 4;
  check_na(c, 31);
}

TEST(CudaNeighborhood, TwoDim) {
  SKIP_WITHOUT_GPU();
  check_na(na_case(DType::kFloat16, 2, {17, 23, 1}, {5, 7, 1}, {3, 2, 1}), 31);
  check_na(na_case(DType::kBFloat16, 2, {33, 47, 1}, {7, 8, 1}, {2, 1, 1}, {false, true, false}),
           32);
  check_na(na_case(DType::kFloat16, 2, {16, 16, 1}, {16, 16, 1}, {1, 1, 1}), 33);  // kernel = grid
  check_na(na_case(DType::kBFloat16, 2, {40, 30, 1}, {13, 6, 1}, {1, 5, 1}, {true, true, false}),
           34);
  check_na(na_case(DType::kFloat16, 2, {1, 200, 1}, {1, 9, 1}, {1, 3, 1}), 35);
}

TEST(CudaNeighborhood, ThreeDim) {
  SKIP_WITHOUT_GPU();
  check_na(na_case(DType::kFloat16, 3, {6, 7, 9}, {3, 4, 2}, {2, 1, 3}, {false, true, false}), 41);
  check_na(na_case(DType::kBFloat16, 3, {3, 4, 5}, {3, 4, 5}, {1, 1, 1}, {false, false, true}), 42);
  check_na(na_case(DType::kFloat16, 3, {8, 9, 10}, {3, 3, 5}, {2, 3, 1}), 43);
}

TEST(CudaNeighborhood, HeadDimsAndGqa) {
  SKIP_WITHOUT_GPU();
  for (auto [d, dv] :
       {std::pair<int, int>{32, 32}, {64, 32}, {80, 80}, {128, 128}, {8, 40}, {20, 36}}) {
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      AttentionCase c = na_case(dt, 2, {9, 11, 1}, {3, 5, 1}, {2, 1, 1}, {false, true, false});
      c.head_dim = d;
      c.value_dim = dv;
      c.heads = 4;
      c.kv_heads = 2;
      check_na(c, 51);
    }
  }
  AttentionCase c = na_case(DType::kFloat16, 1, {70, 1, 1}, {5, 1, 1}, {1, 1, 1});
  c.heads = 6;
  c.kv_heads = 1;  // MQA
  check_na(c, 52);
}

// More query boxes than the GPU has SMs, so that the sm90 forward's persistent blocks walk
// several grid tiles each: the copy warpgroup stages a tile's boxes while the math warps finish
// the one before (both query-box buffers in turn, the key-box ring carried from tile to tile),
// with extra keys, sinks and lse; 2-D 13 x 13 and 3-D 5 x 5 x 5 as the benchmark's kernels.
TEST(CudaNeighborhood, PersistentBlocks) {
  SKIP_WITHOUT_GPU();
  AttentionCase c = na_case(DType::kBFloat16, 2, {48, 40, 1}, {13, 13, 1}, {1, 1, 1});
  c.heads = 8;
  c.kv_heads = 2;
  c.extra = 5;
  c.sinks = true;
  check_na(c, 91);
  AttentionCase d = na_case(DType::kFloat16, 3, {9, 16, 15}, {5, 5, 5}, {1, 2, 1});
  d.heads = 6;
  d.kv_heads = 6;
  d.head_dim = d.value_dim = 128;
  check_na(d, 92);
  AttentionCase e =
      na_case(DType::kBFloat16, 2, {37, 45, 1}, {7, 7, 1}, {2, 3, 1}, {false, true, false});
  e.heads = 8;
  e.head_dim = e.value_dim = 96;
  check_na(e, 93);
}

// fp32 (tf32 tensor cores, 3xTF32 split; SPEC §13 1e-5): 1-3 D grids, head dims up to 256 (the
// bucket whose neighborhood bookkeeping takes shared memory past 99 KB), GQA, every score option.
TEST(CudaNeighborhood, Float32) {
  SKIP_WITHOUT_GPU();
  const DType f = DType::kFloat32;
  check_na(na_case(f, 1, {1000, 1, 1}, {7, 1, 1}, {1, 1, 1}), 61);
  check_na(na_case(f, 2, {17, 23, 1}, {5, 7, 1}, {3, 2, 1}), 62);
  check_na(na_case(f, 3, {6, 7, 9}, {3, 4, 2}, {2, 1, 3}, {false, true, false}), 63);
  for (auto [d, dv] :
       {std::pair<int, int>{32, 32}, {64, 32}, {128, 128}, {200, 200}, {256, 256}, {20, 36}}) {
    AttentionCase c = na_case(f, 2, {9, 11, 1}, {3, 5, 1}, {2, 1, 1}, {false, true, false});
    c.head_dim = d;
    c.value_dim = dv;
    c.heads = 4;
    c.kv_heads = 2;
    check_na(c, 64);
  }
  AttentionCase c = na_case(f, 2, {6, 5, 1}, {3, 2, 1}, {2, 2, 1}, {false, true, false});
  c.sinks = true;
  c.extra = 70;
  c.options.softcap = 3.0f;
  c.bias.given = true;
  c.rel_hk = 6;
  check_na(c, 65);
}

TEST(CudaNeighborhood, ExtraKeysSinksSoftcapBiasRelPos) {
  SKIP_WITHOUT_GPU();
  AttentionCase c =
      na_case(DType::kFloat16, 2, {6, 5, 1}, {3, 2, 1}, {2, 2, 1}, {false, true, false});
  c.extra = 3;
  check_na(c, 61);
  c.sinks = true;
  check_na(c, 62);
  c.extra = 70;  // more than one tile of extra keys
  c.options.softcap = 3.0f;
  c.options.scale = 0.5f;
  c.dtype = DType::kBFloat16;
  check_na(c, 63);
  c.bias.given = true;
  c.rel_hk = 6;  // the key grid itself: Hk = X1, Wk = X2
  check_na(c, 64);
  c.bias = {.given = true, .broadcast = {true, false, true, false}, .zero_stride = true};
  c.dtype = DType::kFloat16;
  check_na(c, 65);
  AttentionCase big = na_case(DType::kBFloat16, 3, {6, 7, 9}, {3, 3, 3}, {1, 2, 3});
  big.extra = 5;
  big.sinks = true;
  big.options.softcap = 10.0f;
  check_na(big, 66);
}

TEST(CudaNeighborhood, Layouts) {
  SKIP_WITHOUT_GPU();
  for (Storage s : {Storage::kPadded, Storage::kHeadsOuter, Storage::kBroadcastBatch}) {
    AttentionCase c = na_case(DType::kFloat16, 2, {15, 13, 1}, {3, 5, 1}, {1, 2, 1});
    c.heads = 4;
    c.kv_heads = 2;
    c.q_storage = s;
    c.kv_storage = s;
    check_na(c, 71);
  }
}

// Dilated windows wider than a block: key boxes of one dilation group seen whole (no mask), next
// to partial boxes and holes (dilation not dividing the grid), with a causal axis too.
TEST(CudaNeighborhood, DilatedWideWindows) {
  SKIP_WITHOUT_GPU();
  check_na(na_case(DType::kFloat16, 1, {1000, 1, 1}, {300, 1, 1}, {3, 1, 1}), 91);
  check_na(na_case(DType::kBFloat16, 1, {1001, 1, 1}, {250, 1, 1}, {4, 1, 1}, {true, false, false}),
           92);
  check_na(na_case(DType::kFloat16, 2, {48, 40, 1}, {23, 19, 1}, {2, 2, 1}), 93);
}

// A dilated 1-D grid runs its dilation groups as window masks (neighborhood.cu,
// dilation_groups): as the batches of one launch (a batch of one, the dilation dividing the grid:
// GQA, causal with a group-sized kernel, a long axis inside a 2-D grid with sinks and extra keys,
// D 128 with softcap), or one launch a group (a ragged grid, batches of two with extra keys); a
// dilation above 16 and a bias keep the token tiles.
TEST(CudaNeighborhood, DilationGroups) {
  SKIP_WITHOUT_GPU();
  AttentionCase gqa = na_case(DType::kFloat16, 1, {1200, 1, 1}, {255, 1, 1}, {4, 1, 1});
  gqa.batch = 1;
  gqa.heads = 4;
  gqa.kv_heads = 2;
  check_na(gqa, 97);
  AttentionCase whole =
      na_case(DType::kBFloat16, 1, {999, 1, 1}, {111, 1, 1}, {9, 1, 1}, {true, false, false});
  whole.batch = 1;
  check_na(whole, 98);
  AttentionCase axis = na_case(DType::kFloat16, 2, {1, 960, 1}, {1, 119, 1}, {1, 8, 1});
  axis.batch = 1;
  axis.sinks = true;
  axis.extra = 3;
  check_na(axis, 99);
  AttentionCase wide = na_case(DType::kBFloat16, 1, {2048, 1, 1}, {129, 1, 1}, {8, 1, 1});
  wide.batch = 1;
  wide.head_dim = wide.value_dim = 128;
  wide.options.softcap = 5.0f;
  check_na(wide, 100);
  AttentionCase ragged = na_case(DType::kBFloat16, 1, {1001, 1, 1}, {250, 1, 1}, {4, 1, 1});
  ragged.batch = 1;
  check_na(ragged, 101);
  AttentionCase batches = na_case(DType::kFloat16, 1, {1203, 1, 1}, {200, 1, 1}, {6, 1, 1});
  batches.extra = 5;
  batches.sinks = true;
  check_na(batches, 102);
  check_na(na_case(DType::kBFloat16, 1, {700, 1, 1}, {21, 1, 1}, {17, 1, 1}), 103);
  AttentionCase bias = na_case(DType::kFloat16, 1, {600, 1, 1}, {99, 1, 1}, {3, 1, 1});
  bias.bias.given = true;
  check_na(bias, 104);
}

// Head dims above 128: 64-key tiles, and two K/V stages at buckets 224 and 256 (where the token
// bookkeeping takes the third one's room).
TEST(CudaNeighborhood, WideHeadDims) {
  SKIP_WITHOUT_GPU();
  for (int d : {160, 224, 256}) {
    AttentionCase c =
        na_case(DType::kBFloat16, 2, {9, 11, 1}, {3, 5, 1}, {2, 1, 1}, {false, true, false});
    c.head_dim = c.value_dim = d;
    check_na(c, 95);
    AttentionCase wide = na_case(DType::kFloat16, 1, {300, 1, 1}, {200, 1, 1}, {1, 1, 1});
    wide.head_dim = d;
    wide.value_dim = d - 24;
    check_na(wide, 96);
  }
}

// Grid axes that do not collapse into one token stride: refused clearly, forward and backward.
TEST(CudaNeighborhoodSmall, Refusals) {
  SKIP_WITHOUT_GPU();
  AttentionCase c = na_case(DType::kFloat16, 2, {5, 6, 1}, {3, 3, 1}, {1, 1, 1});
  c.backward = true;
  CaseTensors t = fmha_test::make_tensors(c, 81);
  DeviceCase dev(c, t);
  // q stored with X2 = 7 rows per X1 row, viewed with 6: axis X1's stride is not 6 x axis X2's.
  HostTensor wide(DType::kFloat16, {2, 5, 7, 2, 64});
  fmha::TensorView q = dev.copies.upload(wide);
  q.shape[2] = 6;
  fmha::NeighborhoodForwardParams p = dev.params(c);
  p.q = q;
  const fmha::Status fs = fmha::run(p);
  EXPECT_EQ(fs.code(), fmha::StatusCode::kNotSupported) << fs.message();
  EXPECT_NE(fs.message().find("row-major"), std::string::npos) << fs.message();

  DeviceCopies grads;
  fmha::NeighborhoodBackwardParams backward;
  backward.q = q;
  backward.k = dev.k;
  backward.v = dev.v;
  backward.out = dev.out;
  backward.lse = dev.lse;
  backward.dout = grads.upload(t.dout);
  backward.neighborhood = c.neighborhood;
  backward.options = dev.options;
  backward.grads.dq = grads.upload(t.dq);
  backward.grads.dk = grads.upload(t.dk);
  backward.grads.dv = grads.upload(t.dv);
  const fmha::Status bs = fmha::run(backward);
  EXPECT_EQ(bs.code(), fmha::StatusCode::kNotSupported) << bs.message();
  EXPECT_NE(bs.message().find("row-major"), std::string::npos) << bs.message();
}

}  // namespace
}  // namespace fmha_cuda_test
