// The CUDA forward (sm80 mma.sync kernel) against the CPU reference: odd shapes, every head-dim
// bucket, Dv != D, GQA/MQA, strided and unaligned layouts, masks, softcap, sinks, extra keys,
// bias, rel-pos, varlen, determinism, and the refusals of what it does not cover.
#include <gtest/gtest.h>

#include <utility>

#include "cuda/cuda_forward_case.h"

namespace fmha_cuda_test {
namespace {

using fmha::CausalAlignment;

#define SKIP_WITHOUT_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present"

ForwardCase shape_case(DType dtype, std::int64_t lq, std::int64_t lk, std::int64_t d,
                       std::int64_t dv, std::int64_t h, std::int64_t hkv, std::int64_t b = 1) {
  ForwardCase c;
  c.dtype = dtype;
  c.batch = b;
  c.seqlen_q = lq;
  c.seqlen_k = lk;
  c.head_dim = d;
  c.value_dim = dv;
  c.heads = h;
  c.kv_heads = hkv;
  return c;
}

TEST(CudaForward, OddShapesAndHeadDims) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    check_forward(shape_case(dt, 1, 1, 8, 8, 2, 1), 1);
    check_forward(shape_case(dt, 17, 113, 40, 40, 16, 4), 2);
    check_forward(shape_case(dt, 113, 17, 72, 72, 8, 1, 2), 3);
    check_forward(shape_case(dt, 239, 577, 80, 80, 4, 2), 4);
    check_forward(shape_case(dt, 577, 239, 96, 96, 2, 2), 5);
    check_forward(shape_case(dt, 113, 239, 200, 200, 2, 1), 6);
    check_forward(shape_case(dt, 239, 113, 256, 256, 2, 1), 7);
    check_forward(shape_case(dt, 64, 128, 128, 128, 2, 2, 2), 8);
  }
}

TEST(CudaForward, ValueDimDiffersFromHeadDim) {
  SKIP_WITHOUT_GPU();
  check_forward(shape_case(DType::kFloat16, 113, 239, 128, 64, 4, 2), 11);
  check_forward(shape_case(DType::kBFloat16, 239, 113, 64, 128, 4, 1), 12);
  check_forward(shape_case(DType::kFloat16, 17, 577, 24, 256, 2, 1), 13);
  check_forward(shape_case(DType::kBFloat16, 33, 65, 160, 40, 2, 2), 14);
}

// Head dims that are not multiples of 8 take the element-wise load/store path.
TEST(CudaForward, HeadDimsNotMultipleOf8) {
  SKIP_WITHOUT_GPU();
  check_forward(shape_case(DType::kFloat16, 17, 113, 1, 1, 2, 1), 21);
  check_forward(shape_case(DType::kBFloat16, 113, 17, 3, 5, 2, 1), 22);
  check_forward(shape_case(DType::kFloat16, 65, 70, 100, 36, 4, 2), 23);
  check_forward(shape_case(DType::kBFloat16, 40, 41, 255, 129, 2, 1), 24);
  // Rows padded to 16-byte strides (dims 5 and 13 padded by 3): the loads may go by TMA, but out's
  // rows are no whole 16-byte chunks, which a bulk tensor store would overwrite up to the next
  // boundary (out's padding is checked untouched).
  for (std::int64_t dim : {5, 13}) {
    const DType dtype = dim == 5 ? DType::kFloat16 : DType::kBFloat16;
    ForwardCase c = shape_case(dtype, 40, 41, dim, dim, 6, 1);
    c.q_layout.pad = c.kv_layout.pad = c.out_layout.pad = 3;
    check_forward(c, 25 + dim);
  }
}

TEST(CudaForward, StridedLayouts) {
  SKIP_WITHOUT_GPU();
  ForwardCase c = shape_case(DType::kFloat16, 113, 239, 64, 64, 4, 2, 2);
  c.q_layout.order = {0, 2, 1, 3};  // q stored [B, H, L, D]
  c.kv_layout.pad = 8;              // padded rows, still 16-byte aligned
  c.out_layout.pad = 8;
  check_forward(c, 31);
  c.kv_layout.pad = 3;   // unaligned rows: element-wise loads
  c.out_layout.pad = 1;  // unaligned rows: element-wise stores
  check_forward(c, 32);
  c.kv_layout = {};
  c.kv_layout.broadcast = {false, false, true, false};  // one kv head, stride 0, read by all
  c.dtype = DType::kBFloat16;
  check_forward(c, 33);
}

TEST(CudaForward, ScaleAndLseAbsent) {
  SKIP_WITHOUT_GPU();
  ForwardCase c = shape_case(DType::kFloat16, 70, 90, 64, 64, 2, 1);
  c.options.scale = 0.3f;
  check_forward(c, 41);
  c.lse = false;
  check_forward(c, 42);
}

TEST(CudaForward, CausalBothAlignments) {
  SKIP_WITHOUT_GPU();
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight})
    for (auto [lq, lk] : {std::pair<int, int>{113, 239}, {239, 113}, {128, 128}, {1, 577}}) {
      ForwardCase c = shape_case(DType::kFloat16, lq, lk, 64, 64, 4, 2);
      c.options.causal = true;
      c.options.causal_alignment = align;
      check_forward(c, 51);
    }
  ForwardCase c = shape_case(DType::kBFloat16, 577, 577, 128, 128, 2, 1);
  c.options.causal = true;
  check_forward(c, 52);
}

TEST(CudaForward, WindowsAndFullyMaskedRows) {
  SKIP_WITHOUT_GPU();
  struct W {
    std::int64_t left, right;
    bool causal;
  };
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight})
    for (W w :
         {W{16, 0, false}, W{-1, 5, false}, W{3, 7, true}, W{100, -1, false}, W{0, 0, false}}) {
      ForwardCase c = shape_case(DType::kFloat16, 239, 113, 96, 96, 2, 1);
      c.options.window_left = w.left;
      c.options.window_right = w.right;
      c.options.causal = w.causal;
      c.options.causal_alignment = align;
      check_forward(c, 61);  // bottom-right with Lq > Lk leaves the first rows fully masked
    }
  // Lk = 0: every row fully masked.
  check_forward(shape_case(DType::kBFloat16, 17, 0, 64, 64, 2, 1), 62);
  // Long sliding windows: key tiles start at the window's first key (not a multiple of the tile),
  // partial tiles at both ends of every block's range.
  for (int d : {64, 128}) {
    ForwardCase c = shape_case(DType::kBFloat16, 1000, 1000, d, d, 2, 1);
    c.options.window_left = 301;
    c.options.window_right = 45;
    check_forward(c, 63);
  }
}

TEST(CudaForward, Softcap) {
  SKIP_WITHOUT_GPU();
  ForwardCase c = shape_case(DType::kFloat16, 113, 239, 80, 80, 4, 1);
  c.options.softcap = 5.0f;
  c.options.scale = 2.0f;  // large scores so that the cap bends them
  check_forward(c, 71);
  c.options.causal = true;
  c.dtype = DType::kBFloat16;
  check_forward(c, 72);
}

// Softcap with nothing else but a mask runs its own policy on sm90 (PolicySoftcap: the plain
// policies' schedule, ping-pong and the softmax overlapped with P V, persistent blocks with the copy
// warpgroup): the head dims of its three tile shapes, several row blocks and key tiles, both
// dtypes, causal in both alignments, a window, GQA, varlen, and softcap with sinks and extra keys.
TEST(CudaForward, SoftcapAlone) {
  SKIP_WITHOUT_GPU();
  for (std::int64_t d : {64, 120, 256}) {
    ForwardCase c = shape_case(DType::kFloat16, 300, 517, d, d, 4, 2, 2);
    c.options.softcap = 5.0f;
    c.options.scale = 0.5f;  // scores of several units: the cap bends them
    check_forward(c, 171);
    c.dtype = DType::kBFloat16;
    c.options.causal = true;
    check_forward(c, 172);
    c.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
    check_forward(c, 173);
    c.options.causal = false;
    c.options.window_left = 100;
    c.options.window_right = 7;
    c.options.softcap = 30.0f;
    c.options.scale = 2.0f;
    check_forward(c, 174);
  }
  ForwardCase v = shape_case(DType::kFloat16, 0, 0, 128, 128, 8, 1);
  v.varlen_q = {130, 1, 257};
  v.varlen_k = {200, 64, 300};
  v.options.softcap = 8.0f;
  v.options.causal = true;
  check_forward(v, 175);
  v.sinks = true;
  v.extra = 9;
  check_forward(v, 176);
}

TEST(CudaForward, SinksAndExtraKeys) {
  SKIP_WITHOUT_GPU();
  ForwardCase c = shape_case(DType::kFloat16, 113, 239, 64, 64, 4, 2);
  c.sinks = true;
  check_forward(c, 81);
  c.extra = 5;
  check_forward(c, 82);
  c.extra = 70;  // more than one key tile of extra keys
  c.options.causal = true;
  c.options.softcap = 8.0f;
  check_forward(c, 83);
  // Fully masked rows with sinks: out 0, lse = sink; with extra keys: only those are seen.
  ForwardCase m = shape_case(DType::kBFloat16, 77, 30, 40, 40, 2, 1);
  m.options.causal = true;
  m.options.causal_alignment = CausalAlignment::kBottomRight;
  m.sinks = true;
  check_forward(m, 84);
  m.extra = 3;
  check_forward(m, 85);
}

TEST(CudaForward, Bias) {
  SKIP_WITHOUT_GPU();
  ForwardCase c = shape_case(DType::kFloat16, 113, 239, 64, 64, 4, 2, 2);
  c.bias = true;
  check_forward(c, 91);
  c.bias_broadcast = {true, false, true, false};  // [1, H, 1, Lk] through stride 0
  check_forward(c, 92);
  c.bias_size_one = true;  // [1, H, 1, Lk] through size-1 dimensions
  check_forward(c, 94);
  c.bias_size_one = false;
  c.bias_broadcast = {false, true, false, false};
  c.options.causal = true;
  c.options.softcap = 10.0f;
  c.dtype = DType::kBFloat16;
  check_forward(c, 93);

  // Lk a multiple of 8 and 16-byte aligned rows: the sm90 kernel's register form with a bias alone
  // (BiasRegisterForm), with rel-pos too the general policy's staged bias tiles (rows past Lq in
  // the last block, a partial last key tile, D 64 / 128 / 256).
  for (std::int64_t d : {64, 128, 256}) {
    ForwardCase staged = shape_case(DType::kBFloat16, 201, 264, d, d, 4, 2, 2);
    staged.bias = true;
    check_forward(staged, 95 + d);
    staged.bias_broadcast = {true, false, false, false};  // [1, H, Lq, Lk] through stride 0
    staged.options.causal = true;
    check_forward(staged, 96 + d);
    staged.dtype = DType::kFloat16;
    staged.rel_hk = 22;  // bias and rel-pos together (key grid 22 x 12)
    check_forward(staged, 97 + d);
  }
}

// A bias alone with pair-aligned rows: the sm90 forward's PolicyBias register form (each thread's
// bias entries loaded into registers a key tile ahead; ping-pong kept). Odd Lk behind an even row
// stride (the last pair half outside; 484 bytes, which no tensor map takes, so D 32 and 64 stay on
// the register form too), partial first and last tiles under causal and window masks, a bias
// shared by the batches (the grid runs the batch innermost), broadcast rows, extra keys and sinks
// (no bias on extra keys), every head-dim bucket's tile shape.
TEST(CudaForward, BiasRegisterForm) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 400;
  for (std::int64_t d : {32, 64, 96, 128, 160, 256}) {
    ForwardCase c =
        shape_case(d % 64 == 0 ? DType::kBFloat16 : DType::kFloat16, 201, 239, d, d, 4, 2, 2);
    c.bias = true;
    c.bias_pad = 3;  // row stride 242: pairs aligned, the last key alone
    check_forward(c, seed++);
    c.options.causal = true;
    c.options.causal_alignment = CausalAlignment::kBottomRight;
    c.bias_broadcast = {true, false, false, false};  // [1, H, Lq, Lk]: batch innermost
    c.batch = 3;
    check_forward(c, seed++);
    c.options.causal = false;
    c.options.window_left = 40;
    c.options.window_right = 7;
    c.bias_broadcast = {false, false, true, false};  // [B, H, 1, Lk] through stride 0
    c.sinks = true;
    c.extra = 5;
    check_forward(c, seed++);
  }
  ForwardCase one = shape_case(DType::kBFloat16, 1, 500, 80, 64, 3, 1, 4);
  one.bias = true;
  one.bias_size_one = true;
  one.bias_broadcast = {false, true, true, false};  // [B, 1, 1, Lk]: key padding
  check_forward(one, seed++, /*twice=*/true);
}

// A bias alone whose rows a tensor map describes (16-byte aligned, not broadcast over queries), up
// to D 64: the staged form (the copy warpgroup copies each key tile's bias by TMA into a ring of
// two tiles; the softmax reads them with ldmatrix). Odd Lq (rows past it read the map's zeros), Lk
// short of a whole key tile and an odd one behind a padded row, causal and window masks (partial
// first tiles: the bias tile starts at the mask's first key), a bias shared by the batches or by
// the heads (size-1 map dimensions read at 0), GQA, extra keys and sinks, fp16 and bf16, and
// several grid tiles a block (more tiles than the ring has slots, across grid tiles).
TEST(CudaForward, BiasStagedTiles) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 430;
  for (std::int64_t d : {32, 64}) {
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      ForwardCase c = shape_case(dt, 333, 520, d, d, 4, 2, 3);
      c.bias = true;
      check_forward(c, seed++);
      c.bias_pad = 9;  // Lk 519 in rows of 528 (16-byte aligned): the last key tile partial
      c.seqlen_k = 519;
      c.bias_broadcast = {true, false, false, false};  // [1, H, Lq, Lk]: batch innermost
      c.options.causal = true;
      c.options.causal_alignment = CausalAlignment::kBottomRight;
      check_forward(c, seed++);
      c.options.causal = false;
      c.options.window_left = 150;
      c.options.window_right = 20;
      c.bias_broadcast = {false, true, false, false};  // [B, 1, Lq, Lk]
      c.sinks = true;
      c.extra = 9;
      check_forward(c, seed++);
    }
  }
  // Many grid tiles (B 2, H 8, Lq 1000: 128 of them), each with 8 key tiles.
  ForwardCase big = shape_case(DType::kBFloat16, 1000, 1024, 64, 64, 8, 8, 2);
  big.bias = true;
  big.bias_broadcast = {true, false, false, false};
  check_forward(big, seed++, /*twice=*/true);
}

TEST(CudaForward, RelativePositionSam) {
  SKIP_WITHOUT_GPU();
  // SAM-like: a 14 x 14 key grid, D = 80, with and without an additive bias on top.
  ForwardCase c = shape_case(DType::kFloat16, 196, 196, 80, 80, 2, 2);
  c.rel_hk = 14;
  check_forward(c, 101);
  c.bias = true;
  c.dtype = DType::kBFloat16;
  check_forward(c, 102);
  ForwardCase r = shape_case(DType::kFloat16, 17, 15 * 7, 64, 64, 2, 1);  // Hk 15, Wk 7
  r.rel_hk = 15;
  r.batch = 2;
  r.options.causal = true;
  check_forward(r, 103);
}

// Rel-pos alone on power-of-two grid widths: the sm90 forward's PolicyRelPos register form where a
// key tile is two grid rows (Wk 64 up to D 128, Wk 32 above; odd Hk: a last tile with one grid
// row, partial), the general policy for the other widths.
TEST(CudaForward, RelativePositionPowerOfTwoGrid) {
  SKIP_WITHOUT_GPU();
  struct Grid {
    std::int64_t lq, hk, wk, d;
  };
  std::uint64_t seed = 105;
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (Grid g : {Grid{300, 16, 16, 64}, Grid{129, 5, 64, 80}, Grid{77, 3, 128, 32},
                   Grid{200, 4, 64, 64}, Grid{65, 9, 8, 200}, Grid{40, 2, 128, 160},
                   Grid{333, 7, 64, 128}, Grid{90, 5, 32, 192}, Grid{31, 3, 64, 24}}) {
      ForwardCase c = shape_case(dt, g.lq, g.hk * g.wk, g.d, g.d, 4, 2, 2);
      c.rel_hk = g.hk;
      check_forward(c, seed++);
      c.sinks = true;
      c.extra = 5;  // extra keys see no rel-pos
      c.heads = 6;
      c.kv_heads = 1;
      check_forward(c, seed++);
    }
}

TEST(CudaForward, Varlen) {
  SKIP_WITHOUT_GPU();
  ForwardCase c = shape_case(DType::kFloat16, 0, 0, 64, 64, 4, 2);
  c.varlen_q = {17, 0, 113, 64, 1};
  c.varlen_k = {33, 5, 113, 0, 70};
  check_forward(c, 111);
  c.options.causal = true;
  c.options.causal_alignment = CausalAlignment::kBottomRight;
  c.bias = true;
  c.sinks = true;
  c.extra = 3;
  c.dtype = DType::kBFloat16;
  check_forward(c, 112);
  c.q_layout.order = {1, 0, 2};  // q stored [H, T, D]
  c.kv_layout.pad = 3;
  check_forward(c, 113);
}

// Plain attention over 1024 keys or more at D 256 runs the sm90 forward's 80-key tiles
// (PolicyPlainLongRows): a partial last tile, GQA, Dv != D, unaligned head dims, sinks and extra
// keys, a batch, and varlen whose longest sequence takes them while others are short.
TEST(CudaForward, LongRowsAtD256) {
  SKIP_WITHOUT_GPU();
  check_forward(shape_case(DType::kBFloat16, 130, 1103, 256, 256, 4, 2), 91);
  check_forward(shape_case(DType::kFloat16, 65, 1024, 256, 256, 2, 1, 2), 92);
  check_forward(shape_case(DType::kBFloat16, 33, 1201, 250, 200, 2, 1), 93);
  ForwardCase c = shape_case(DType::kFloat16, 200, 1040, 256, 256, 4, 4);
  c.sinks = true;
  c.extra = 90;  // two 80-key tiles of extra keys, the second partial
  check_forward(c, 94);
  ForwardCase v = shape_case(DType::kBFloat16, 0, 0, 256, 256, 4, 2);
  v.varlen_q = {17, 300, 1};
  v.varlen_k = {1100, 33, 0};
  check_forward(v, 95);
}

// Above D 128 the sm90 forward's key tiles hold 64 keys under 128-row blocks (a causal diagonal
// spans two of them), and the output leaves a 64-column block at a time through each warp's
// chunks (D 192: three blocks; D 256 with Dv 192). Causal masks in both alignments (Lq < Lk,
// Lq > Lk, equal), windows with a right side that reaches into the next tile, rows past the last
// block, GQA, extra keys and sinks.
TEST(CudaForward, MasksOnShortKeyTiles) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 700;
  for (std::int64_t d : {192, 256}) {
    for (auto [lq, lk] : {std::pair<int, int>{577, 577}, {300, 700}, {700, 300}, {129, 129}}) {
      for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
        ForwardCase c = shape_case(DType::kBFloat16, lq, lk, d, d, 4, 2);
        c.options.causal = true;
        c.options.causal_alignment = align;
        check_forward(c, seed++);
      }
    }
    struct W {
      std::int64_t left, right;
    };
    for (W w : {W{100, 0}, W{200, 70}, W{-1, 30}, W{63, 63}}) {
      ForwardCase c = shape_case(DType::kFloat16, 500, 500, d, d - 64, 2, 1, 2);
      c.options.window_left = w.left;
      c.options.window_right = w.right;
      check_forward(c, seed++);
    }
  }
  ForwardCase extra = shape_case(DType::kBFloat16, 300, 300, 256, 256, 2, 1);
  extra.options.causal = true;
  extra.extra = 70;
  extra.sinks = true;
  check_forward(extra, seed++);
}

// Plain attention up to D 64 over at most 128 query rows (or 193-256) runs the window policy's
// kernel with an unbounded window (sm90: plain_on_window_kernel): odd lengths, GQA, Dv != D,
// sinks and extra keys, varlen whose longest sequence is short.
TEST(CudaForward, ShortRowsOfSmallHeads) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 760;
  for (auto [lq, lk] : {std::pair<int, int>{128, 128}, {97, 300}, {250, 250}, {200, 33}}) {
    check_forward(shape_case(DType::kBFloat16, lq, lk, 64, 64, 4, 2, 2), seed++);
    check_forward(shape_case(DType::kFloat16, lq, lk, 40, 24, 2, 1), seed++);
  }
  ForwardCase c = shape_case(DType::kBFloat16, 197, 197, 64, 64, 4, 4, 3);
  c.sinks = true;
  c.extra = 20;
  check_forward(c, seed++);
  ForwardCase v = shape_case(DType::kFloat16, 0, 0, 64, 64, 4, 2);
  v.varlen_q = {17, 200, 1};
  v.varlen_k = {300, 33, 0};
  check_forward(v, seed++);
}

TEST(CudaForward, LongCausalWithEverything) {
  SKIP_WITHOUT_GPU();
  ForwardCase c = shape_case(DType::kBFloat16, 1023, 1023, 80, 80, 2, 1);
  c.options.causal = true;
  c.options.window_left = 300;
  c.options.softcap = 20.0f;
  c.bias = true;
  c.bias_broadcast = {true, false, false, false};
  c.sinks = true;
  c.extra = 4;
  check_forward(c, 115);
}

TEST(CudaForward, DeterministicRunTwice) {
  SKIP_WITHOUT_GPU();
  ForwardCase c = shape_case(DType::kBFloat16, 239, 577, 128, 128, 4, 2);
  c.options.causal = true;
  c.options.deterministic = true;
  c.sinks = true;
  check_forward(c, 121, /*twice=*/true);
}

// k and v rows 150M elements apart: the last key row starts past 2^31 elements (4.8 GB each).
TEST(CudaForward, SixtyFourBitOffsets) {
  SKIP_WITHOUT_GPU();
  constexpr std::size_t kNeeded = std::size_t{12} << 30;
  if (free_device_memory() < kNeeded) GTEST_SKIP() << "needs 12 GB of free device memory";
  ForwardCase c = shape_case(DType::kFloat16, 17, 17, 64, 64, 1, 1);
  c.kv_layout.pad = 150'000'000;
  check_forward(c, 131);
}

TEST(CudaForward, EmptyQueries) {
  SKIP_WITHOUT_GPU();
  const fmha::Status s = run_forward_status(shape_case(DType::kFloat16, 0, 17, 64, 64, 2, 1));
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(CudaForward, RefusesFloat64WithReason) {
  SKIP_WITHOUT_GPU();
  const fmha::Status d = run_forward_status(shape_case(DType::kFloat64, 17, 17, 64, 64, 2, 1));
  EXPECT_EQ(d.code(), fmha::StatusCode::kNotSupported);
  EXPECT_NE(d.message().find("float64"), std::string::npos) << d.message();
}

// fp32 (tf32 tensor cores, 3xTF32 split): norm-wise error <= 1e-5 against the float64 reference,
// every head-dim bucket and the same features as the 16-bit kernels.
TEST(CudaForward, Float32ShapesAndHeadDims) {
  SKIP_WITHOUT_GPU();
  const DType f = DType::kFloat32;
  check_forward(shape_case(f, 1, 1, 8, 8, 2, 1), 201);
  check_forward(shape_case(f, 17, 113, 40, 40, 16, 4), 202);
  check_forward(shape_case(f, 113, 17, 72, 72, 8, 1, 2), 203);
  check_forward(shape_case(f, 239, 577, 64, 64, 4, 2), 204);
  check_forward(shape_case(f, 577, 239, 128, 128, 2, 2), 205);
  check_forward(shape_case(f, 113, 239, 160, 160, 2, 1), 206);
  check_forward(shape_case(f, 113, 239, 200, 200, 2, 1), 207);
  check_forward(shape_case(f, 239, 113, 224, 224, 2, 1), 208);
  check_forward(shape_case(f, 239, 113, 256, 256, 2, 1), 209);
  check_forward(shape_case(f, 64, 128, 32, 32, 2, 2, 2), 210);
  // Dv != D, and head dims that are not multiples of 4 (element-wise loads and stores).
  check_forward(shape_case(f, 113, 239, 128, 64, 4, 2), 211);
  check_forward(shape_case(f, 17, 577, 24, 256, 2, 1), 212);
  check_forward(shape_case(f, 113, 17, 3, 5, 2, 1), 213);
  check_forward(shape_case(f, 40, 41, 255, 129, 2, 1), 214);
  check_forward(shape_case(f, 65, 70, 100, 36, 4, 2), 215);
}

TEST(CudaForward, Float32Features) {
  SKIP_WITHOUT_GPU();
  const DType f = DType::kFloat32;
  ForwardCase c = shape_case(f, 113, 239, 64, 64, 4, 2, 2);
  c.q_layout.order = {0, 2, 1, 3};
  c.kv_layout.pad = 4;  // padded rows, still 16-byte aligned
  c.out_layout.pad = 4;
  check_forward(c, 221);
  c.kv_layout.pad = 3;  // unaligned rows: element-wise loads and stores
  c.out_layout.pad = 1;
  check_forward(c, 222);
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
    ForwardCase m = shape_case(f, 239, 113, 96, 96, 2, 1);
    m.options.causal = true;
    m.options.window_left = 16;
    m.options.causal_alignment = align;
    check_forward(m, 223);
  }
  ForwardCase s = shape_case(f, 113, 239, 80, 80, 4, 1);
  s.options.softcap = 5.0f;
  s.options.scale = 2.0f;
  s.sinks = true;
  s.extra = 70;
  check_forward(s, 224);
  ForwardCase b = shape_case(f, 113, 239, 64, 64, 4, 2, 2);
  b.bias = true;
  b.bias_broadcast = {true, false, true, false};
  b.options.causal = true;
  check_forward(b, 225);
  ForwardCase r = shape_case(f, 196, 196, 80, 80, 2, 2);
  r.rel_hk = 14;
  r.bias = true;
  check_forward(r, 226);
  ForwardCase v = shape_case(f, 0, 0, 64, 64, 4, 2);
  v.varlen_q = {17, 0, 113, 64, 1};
  v.varlen_k = {33, 5, 113, 0, 70};
  v.options.causal = true;
  v.options.causal_alignment = CausalAlignment::kBottomRight;
  v.bias = true;
  v.sinks = true;
  v.extra = 3;
  check_forward(v, 227);
  check_forward(shape_case(f, 17, 0, 64, 64, 2, 1), 228);  // every row fully masked
}

TEST(CudaForward, Float32AllowTf32AndDeterminism) {
  SKIP_WITHOUT_GPU();
  ForwardCase c = shape_case(DType::kFloat32, 239, 577, 64, 64, 4, 2);
  c.options.allow_tf32 = true;  // one tf32 product: SPEC §13 bound 2e-3
  check_forward(c, 231);
  c.head_dim = c.value_dim = 256;
  check_forward(c, 232);
  ForwardCase d = shape_case(DType::kFloat32, 239, 577, 128, 128, 4, 2);
  d.options.causal = true;
  d.options.deterministic = true;
  d.sinks = true;
  check_forward(d, 233, /*twice=*/true);
}

// The sm90 fp32 forward (tf32 wgmma on split planes; on Hopper the default for dense fp32 up to
// head dim 64 without score modifiers or extra keys), every feature it takes: odd lengths around
// its 128-query and 64-key tiles, D < 64 and Dv != D, GQA, causal in both alignments with windows,
// sinks, a negative scale, strided layouts, rows that see nothing, and bitwise-equal reruns. On
// other GPUs the same cases run the sm80 kernels.
TEST(CudaForward, Float32Sm90Planes) {
  SKIP_WITHOUT_GPU();
  const DType f = DType::kFloat32;
  check_forward(shape_case(f, 129, 65, 64, 64, 4, 2), 241);
  check_forward(shape_case(f, 127, 191, 33, 17, 6, 3, 2), 242);
  check_forward(shape_case(f, 300, 1000, 64, 48, 2, 1), 243, /*twice=*/true);
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
    for (auto [lq, lk] : {std::pair{257, 129}, std::pair{129, 257}, std::pair{200, 200}}) {
      ForwardCase m = shape_case(f, lq, lk, 64, 64, 4, 2);
      m.options.causal = true;
      m.options.causal_alignment = align;
      m.sinks = lq == 200;
      check_forward(m, 244);
    }
    ForwardCase w = shape_case(f, 333, 301, 40, 40, 2, 2);
    w.options.window_left = 70;
    w.options.window_right = 5;
    w.options.causal_alignment = align;
    check_forward(w, 245);
  }
  ForwardCase n = shape_case(f, 150, 90, 64, 64, 2, 1);
  n.options.scale = -0.3f;
  n.q_layout.order = {0, 2, 1, 3};
  n.kv_layout.pad = 3;
  n.out_layout.pad = 1;
  check_forward(n, 246);
  ForwardCase e = shape_case(f, 300, 90, 64, 64, 2, 1);
  e.options.window_left = 0;
  e.options.window_right = 0;
  e.sinks = true;
  check_forward(e, 247);  // rows 90-299 see no key: whole blocks without a key tile
}

}  // namespace
}  // namespace fmha_cuda_test
