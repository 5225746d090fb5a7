// The CUDA backward against the CPU reference (cuda_backward_case.h), part two: softcap, sinks and
// extra keys, bias and dbias, rel-pos and drel (both the sm80 and the sm90 paths), fp32, and the
// refusals.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <utility>

#include "cuda_backward_case.h"

namespace fmha_cuda_test {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present"

TEST(CudaBackward, Softcap) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 113, 239, 80, 80, 4, 1);
  c.options.softcap = 5.0f;
  c.options.scale = 2.0f;  // large scores so that the cap bends them
  check_backward(c, 71);
  c.options.causal = true;
  c.dtype = DType::kBFloat16;
  check_backward(c, 72);
}

// Softcap alone at head-dim buckets 64 and 128: on Hopper `fused` (and `auto`) run the
// warp-specialized fused kernel's softcap policy, `split` the split kernels' general policy. No
// mask, causal (both alignments), a sliding window; odd lengths, Lq > Lk, GQA; scores that the cap
// bends hard (scale 2) and mildly (the default scale); fp16 and bf16; sinks; deterministic mode
// bit for bit.
// One shape under softcap's masks: a hard cap (scale 2) without a mask and causal, a mild one
// (the default scale) causal bottom-right, then a window (with sinks where asked).
void check_softcap_masks(BackwardCase c, std::uint64_t* seed, std::int64_t window_left,
                         std::int64_t window_right, bool sinks_with_window) {
  c.options.softcap = 5.0f;
  c.options.scale = 2.0f;  // large scores, so that the cap bends them
  check_backward(c, (*seed)++);
  c.options.causal = true;
  check_backward(c, (*seed)++);
  c.options.scale.reset();  // 1 / sqrt(D)
  c.options.softcap = 3.0f;
  c.options.causal_alignment = CausalAlignment::kBottomRight;
  check_backward(c, (*seed)++);
  c.options.causal = false;
  c.options.causal_alignment = CausalAlignment::kTopLeft;
  c.options.window_left = window_left;
  c.options.window_right = window_right;
  c.sinks = sinks_with_window;
  check_backward(c, (*seed)++);
}

TEST(CudaBackward, SoftcapAlone) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 260;
  for (std::int64_t dim : {64, 128}) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16})
      check_softcap_masks(shape_case(dtype, 239, 577, dim, dim, 4, 2, 2), &seed, 100, 17, false);
  }
  BackwardCase t = shape_case(DType::kBFloat16, 577, 113, 128, 128, 4, 1);  // Lq > Lk, MQA
  t.options.softcap = 8.0f;
  t.options.causal = true;
  t.options.causal_alignment = CausalAlignment::kBottomRight;
  t.sinks = true;
  check_backward(t, seed++);
  BackwardCase o = shape_case(DType::kFloat16, 1, 17, 40, 40, 2, 2);  // one query, D 40
  o.options.softcap = 2.0f;
  check_backward(o, seed++);
  BackwardCase d = shape_case(DType::kBFloat16, 300, 300, 64, 64, 4, 2, 2);
  d.options.softcap = 5.0f;
  d.options.causal = true;
  d.options.deterministic = true;
  d.impls = {BackwardImpl::kAuto};
  check_backward(d, seed++, /*twice=*/true);
}

// Softcap alone at head-dim bucket 256: on Hopper `split` (and `auto`) take dK and dV from the
// warp-specialized D 256 kernel's softcap policy without its dQ part, beside the general policy's
// dQ kernel; `fused` runs the general policy's kernels. Hard and mild caps, no mask, causal both
// alignments, a window with sinks, odd lengths, Lq > Lk, GQA, Dv != D, fp16 and bf16; a varlen
// batch (the general policy's part kernels: the tensor maps describe dense batches only); the
// deterministic path bit for bit.
TEST(CudaBackward, SoftcapAloneD256) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 280;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16})
    check_softcap_masks(shape_case(dtype, 239, 301, 256, 256, 4, 2, 2), &seed, 70, 13, true);
  BackwardCase t = shape_case(DType::kBFloat16, 577, 113, 256, 128, 4, 1);  // Lq > Lk, MQA, Dv 128
  t.options.softcap = 8.0f;
  t.options.causal = true;
  t.options.causal_alignment = CausalAlignment::kBottomRight;
  check_backward(t, seed++);
  BackwardCase v = shape_case(DType::kFloat16, 0, 0, 256, 256, 4, 2);
  v.varlen_q = {17, 113, 64};
  v.varlen_k = {33, 113, 70};
  v.options.softcap = 4.0f;
  check_backward(v, seed++);
  BackwardCase d = shape_case(DType::kBFloat16, 300, 300, 256, 256, 4, 2, 2);
  d.options.softcap = 5.0f;
  d.options.causal = true;
  d.options.deterministic = true;
  d.impls = {BackwardImpl::kAuto};
  check_backward(d, seed++, /*twice=*/true);
}

TEST(CudaBackward, SinksAndExtraKeys) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 113, 239, 64, 64, 4, 2, 2);
  c.sinks = true;
  check_backward(c, 81);
  c.extra = 5;
  check_backward(c, 82);
  c.extra = 70;  // more than one key tile of extra keys
  c.options.causal = true;
  c.options.softcap = 8.0f;
  c.head_dim = c.value_dim = 200;  // sm90: dK and dV from two kernels
  check_backward(c, 83);
  // Fully masked rows with sinks (P_sink = 1) and with extra keys (only those are seen).
  BackwardCase m = shape_case(DType::kBFloat16, 77, 30, 40, 40, 2, 1);
  m.options.causal = true;
  m.options.causal_alignment = CausalAlignment::kBottomRight;
  m.sinks = true;
  check_backward(m, 84);
  m.extra = 3;
  check_backward(m, 85);
}

// An empty batch: dsinks sums over no rows, so it is zero (not left as it was).
TEST(CudaBackward, EmptyBatchSinks) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 33, 40, 64, 64, 4, 2, /*b=*/0);
  c.sinks = true;
  check_backward(c, 86);
  c.dtype = DType::kBFloat16;
  c.options.causal = true;
  check_backward(c, 87);
  // fp32 on Hopper: its kernels' operand planes are empty too, so no kernel runs.
  c.dtype = DType::kFloat32;
  c.head_dim = c.value_dim = 24;
  check_backward(c, 88);
  BackwardCase none = shape_case(DType::kFloat32, 0, 0, 24, 24, 6, 2, 2);  // no query, no key
  none.sinks = true;
  check_backward(none, 89);
}

TEST(CudaBackward, BiasAndItsGradient) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 113, 239, 64, 64, 4, 2, 2);
  c.bias = true;
  c.options.causal = true;
  check_backward(c, 91);  // bias read, no dbias
  c.dbias = true;
  check_backward(c, 92);
  c.bias_broadcast = {true, false, true, false};  // [1, H, 1, Lk]: dbias sums over B and Lq
  check_backward(c, 93);
  c.bias_broadcast = {false, true, false, true};  // sums over H and Lk
  c.options.softcap = 10.0f;
  c.dtype = DType::kBFloat16;
  check_backward(c, 94);
}

// Bias rows in whole 16-byte chunks (Lk % 8 == 0, contiguous): the Hopper kernels stage the bias
// tiles in shared memory (the cases above, Lk 239, read it from global memory), and GQA, where the
// dK/dV kernel walks the group's heads with a bias tile per head.
TEST(CudaBackward, BiasOnWholeChunkRows) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kBFloat16, 200, 256, 64, 64, 4, 2, 2);
  c.bias = true;
  c.dbias = true;
  check_backward(c, 95);
  c.options.causal = true;
  c.head_dim = c.value_dim = 128;
  check_backward(c, 96);
  c.head_dim = c.value_dim = 200;  // dK and dV from two kernels; dbias from the dQ kernel
  c.dtype = DType::kFloat16;
  check_backward(c, 97);
  BackwardCase w = shape_case(DType::kBFloat16, 136, 264, 96, 96, 4, 1, 3);
  w.bias = true;
  w.dbias = true;
  w.bias_broadcast = {true, false, false, false};  // [1, H, Lq, Lk], SAM's case: summed over B
  check_backward(w, 98);
  w.dbias = false;
  w.options.softcap = 6.0f;  // softcap and bias, no dbias: the general policy on Hopper too
  w.options.window_left = 40;
  w.options.window_right = 17;
  check_backward(w, 99);
  // Long sliding windows: key tiles (dQ) and query tiles (dK/dV) start at the first visible key
  // or query, not at a multiple of the tile; with dbias (staged bias tiles, pair stores).
  for (int dim : {64, 128}) {
    BackwardCase s = shape_case(DType::kBFloat16, 1000, 1000, dim, dim, 2, 1);
    s.options.window_left = 301;
    s.options.window_right = 45;
    check_backward(s, 101);
    s.bias = true;
    s.dbias = true;
    check_backward(s, 102);
  }
  BackwardCase d = shape_case(DType::kFloat16, 136, 264, 64, 64, 4, 2, 2);
  d.bias = true;
  d.dbias = true;  // full size: stored, not summed, so bitwise identical run to run
  d.options.deterministic = true;
  d.impls = {BackwardImpl::kAuto};
  check_backward(d, 100, /*twice=*/true);
}

// The cases a form of the bias policy is tested on, from `c` (its shape and bias layout): a bias
// with its gradient; causal bottom-right with a bias shared by the batches (batch innermost, dbias
// summed over B); a window of window_left keys to the left and 9 to the right with sinks and extra
// keys, without dbias.
void check_bias_alone(BackwardCase c, std::int64_t window_left, std::uint64_t* seed) {
  c.bias = true;
  c.dbias = true;
  check_backward(c, (*seed)++);
  c.options.causal = true;
  c.options.causal_alignment = CausalAlignment::kBottomRight;
  c.bias_broadcast = {true, false, false, false};  // [1, H, Lq, Lk]: dbias summed over B
  c.batch = 3;
  check_backward(c, (*seed)++);
  c.options.causal = false;
  c.options.window_left = window_left;
  c.options.window_right = 9;
  c.dbias = false;
  c.sinks = true;
  c.extra = 4;
  check_backward(c, (*seed)++);
}

// A bias alone with pair-aligned rows: the sm90 dQ kernel's PolicyBias register form (the dK/dV
// kernel reads it transposed, general policy). Odd Lk behind an even row stride (the last key's
// pair half outside), masks with partial first and last key tiles, a bias shared by the batches,
// extra keys and sinks, every key-tile width of the dQ kernel (128 / 64 / 32 keys for D 64 / 128 /
// 256).
TEST(CudaBackward, BiasRegisterForm) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 420;
  for (std::int64_t d : {32, 64, 128, 160, 256}) {
    BackwardCase c =
        shape_case(d == 128 ? DType::kFloat16 : DType::kBFloat16, 201, 239, d, d, 4, 2, 2);
    c.bias_pad = 1;  // row stride 240
    check_bias_alone(c, 50, &seed);
  }
}

// A bias alone in whole 16-byte chunks: the sm90 kernels stage the bias policy's tiles (by TMA in
// a dense batch, else by every thread's cp.async: FMHA_SM90_TMA=0, scripts/gpu-check.sh) and read
// them with ldmatrix, the dQ kernel up to D 64 (the register form above), the dK/dV kernel
// transposed at every width of its query tiles (96 / 64 / 32 queries at D 64 / 128 / 160). Odd Lq
// (rows past it staged as zeros), a partial last key tile, causal and window masks (key tiles
// start at the first visible key), dbias stored or summed over the batches, a bias shared by the
// batches (read at batch 0), extra keys and sinks, GQA (each query head's own bias).
TEST(CudaBackward, BiasStagedTiles) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 440;
  for (std::int64_t d : {32, 64, 128, 160}) {
    BackwardCase c = shape_case(d == 32 || d == 128 ? DType::kFloat16 : DType::kBFloat16, 201, 264,
                                d, d, 4, 2, 2);
    check_bias_alone(c, 150, &seed);
  }
}

TEST(CudaBackward, RelativePositionSam) {
  SKIP_WITHOUT_GPU();
  // SAM-like: a 14 x 14 key grid, D = 80, with and without an additive bias on top.
  BackwardCase c = shape_case(DType::kFloat16, 196, 196, 80, 80, 2, 2);
  c.rel_hk = 14;
  c.drel = true;
  check_backward(c, 101);
  c.bias = true;
  c.dbias = true;
  c.dtype = DType::kBFloat16;
  check_backward(c, 102);
  BackwardCase r = shape_case(DType::kFloat16, 17, 15 * 7, 64, 64, 2, 1);  // Hk 15, Wk 7
  r.rel_hk = 15;
  r.drel = true;
  check_backward(r, 103);
  // Above D 128 the sm80 dK/dV kernel runs two column chunks that both recompute dS: the atomic
  // sums into drel and a broadcast dbias must come from one of them only.
  BackwardCase w = shape_case(DType::kBFloat16, 77, 12 * 10, 200, 160, 2, 1);
  w.rel_hk = 12;
  w.drel = true;
  w.bias = true;
  w.dbias = true;
  w.bias_broadcast = {true, false, false, false};  // [1, H, Lq, Lk]: dbias sums over B
  w.batch = 2;
  check_backward(w, 104);
}

// Rel-pos alone on a power-of-two grid width dividing the key tiles: on sm90 the split kernels
// with PolicyRelPos (drel_h / drel_w summed per query row in the dQ kernel, no atomics, hence
// deterministic). The dQ kernel's register form where a key tile is two grid rows (D 64 Wk 64,
// D 128 Wk 32, D 192 Wk 16; odd Hk: a last tile of one) or one at 64- and 32-key tiles (D 80 and
// 128 Wk 64, D 256 Wk 32); its staged form for the other widths (D 32 Wk 128 with constant
// widths); other widths and head dims fall back to the sm80 kernels.
TEST(CudaBackward, RelativePositionPowerOfTwoGrid) {
  SKIP_WITHOUT_GPU();
  struct Grid {
    std::int64_t lq, hk, wk, d;
  };
  std::uint64_t seed = 104;
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (Grid g :
         {Grid{300, 16, 16, 64}, Grid{129, 5, 64, 80}, Grid{77, 3, 128, 32}, Grid{65, 8, 8, 40},
          Grid{90, 2, 128, 80}, Grid{100, 4, 32, 64}, Grid{150, 7, 64, 64}, Grid{70, 3, 64, 128},
          Grid{111, 5, 32, 128}, Grid{60, 6, 16, 192}, Grid{45, 3, 32, 256}}) {
      BackwardCase c = shape_case(dt, g.lq, g.hk * g.wk, g.d, g.d, 4, 2, 2);
      c.rel_hk = g.hk;
      c.drel = true;
      check_backward(c, seed++);
    }
  BackwardCase c = shape_case(DType::kBFloat16, 200, 4 * 64, 64, 64, 6, 1, 2);
  c.rel_hk = 4;
  c.drel = true;
  c.options.deterministic = true;
  // The sm80 kernels (before Hopper, or FMHA_CUDA_KERNELS=sm80) sum drel with atomics: they
  // refuse; the sm90 ones must give bitwise-equal gradients twice.
  int device = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  const char* kernels = std::getenv("FMHA_CUDA_KERNELS");
  if (major == 9 && (kernels == nullptr || std::string(kernels) != "sm80")) {
    check_backward(c, seed, /*twice=*/true);
  } else {
    std::mt19937_64 rng(seed);
    Tensors t = make_tensors(c, c.dtype, DType::kFloat32, &rng);
    DeviceTensors dev;
    dev.upload(t);
    if (::testing::Test::HasFatalFailure()) return;
    const fmha::Status s = run_backward(c, dev.views(), BackwardImpl::kAuto);
    EXPECT_EQ(s.code(), fmha::StatusCode::kNotSupported);
    EXPECT_NE(s.message().find("deterministic=true with grads.drel_h"), std::string::npos)
        << s.message();
  }
}

// fp32 (tf32 tensor cores, 3xTF32 split): every gradient within norm-wise 1e-5 of the float64
// reference, fused and split, every head-dim bucket and the features of the 16-bit kernels.
TEST(CudaBackward, Float32ShapesAndHeadDims) {
  SKIP_WITHOUT_GPU();
  const DType f = DType::kFloat32;
  check_backward(shape_case(f, 1, 1, 8, 8, 2, 1), 201);
  check_backward(shape_case(f, 17, 113, 40, 40, 8, 2), 202);
  check_backward(shape_case(f, 113, 17, 80, 80, 4, 1, 2), 203);
  check_backward(shape_case(f, 239, 113, 128, 128, 8, 2), 204);
  check_backward(shape_case(f, 64, 128, 32, 32, 2, 2, 2), 205);
  check_backward(shape_case(f, 113, 239, 160, 160, 2, 1), 206);
  check_backward(shape_case(f, 40, 41, 200, 72, 2, 1), 207);
  check_backward(shape_case(f, 113, 239, 224, 224, 2, 1), 208);
  check_backward(shape_case(f, 113, 239, 256, 256, 4, 1), 209);
  check_backward(shape_case(f, 113, 239, 128, 64, 4, 2), 210);  // Dv != D
  check_backward(shape_case(f, 113, 17, 3, 5, 4, 1), 211);      // element-wise loads
  check_backward(shape_case(f, 65, 70, 100, 36, 4, 2), 212);
}

TEST(CudaBackward, Float32Features) {
  SKIP_WITHOUT_GPU();
  const DType f = DType::kFloat32;
  BackwardCase l = shape_case(f, 113, 239, 64, 64, 4, 2, 2);
  l.q_layout.order = {0, 2, 1, 3};
  l.kv_layout.pad = 3;  // unaligned rows
  l.grad_layout.pad = 1;
  l.dlse = false;
  check_backward(l, 221);
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
    BackwardCase m = shape_case(f, 239, 113, 96, 96, 4, 2);
    m.options.causal = true;
    m.options.window_left = 16;
    m.options.causal_alignment = align;
    check_backward(m, 222);
  }
  BackwardCase s = shape_case(f, 113, 239, 80, 80, 4, 1);
  s.options.softcap = 5.0f;
  s.options.scale = 2.0f;
  s.sinks = true;
  s.extra = 70;
  check_backward(s, 223);
  BackwardCase b = shape_case(f, 113, 239, 64, 64, 4, 2, 2);
  b.bias = true;
  b.dbias = true;
  b.options.causal = true;
  check_backward(b, 224);
  b.bias_broadcast = {true, false, true, false};  // dbias sums over B and Lq
  check_backward(b, 225);
  BackwardCase r = shape_case(f, 196, 196, 80, 80, 2, 2);
  r.rel_hk = 14;
  r.drel = true;
  check_backward(r, 226);
  BackwardCase v = shape_case(f, 0, 0, 64, 64, 4, 2);
  v.varlen_q = {17, 0, 113, 64, 1};
  v.varlen_k = {33, 5, 113, 0, 70};
  v.options.causal = true;
  v.options.causal_alignment = CausalAlignment::kBottomRight;
  v.sinks = true;
  v.extra = 3;
  v.bias = true;
  v.dbias = true;
  check_backward(v, 227);
  check_backward(shape_case(f, 17, 0, 64, 64, 2, 1), 228);  // every row fully masked
}

TEST(CudaBackward, Float32AllowTf32AndDeterminism) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat32, 239, 577, 64, 64, 4, 2);
  c.options.allow_tf32 = true;  // one tf32 product: SPEC §13 bound 2e-3
  check_backward(c, 231);
  BackwardCase d = shape_case(DType::kFloat32, 239, 577, 128, 128, 8, 2);
  d.options.causal = true;
  d.options.deterministic = true;
  d.sinks = true;
  d.extra = 5;
  d.bias = true;
  d.dbias = true;
  d.impls = {BackwardImpl::kAuto};
  check_backward(d, 232, /*twice=*/true);
}

// The sm90 fp32 backward (tf32 wgmma on split planes; on Hopper the default, split, for dense
// fp32 up to head dim 64 without score modifiers or extra keys), every feature it takes: odd
// lengths around its 64-row blocks and 32-column tiles, D < 64 and Dv != D, GQA (dK / dV summed
// over the group), causal in both alignments with windows, sinks and dlse, a negative scale,
// strided layouts, rows and keys that see nothing, and bitwise-equal reruns. Fused runs the sm80
// kernel, and other GPUs run the sm80 kernels for both.
TEST(CudaBackward, Float32Sm90Planes) {
  SKIP_WITHOUT_GPU();
  const DType f = DType::kFloat32;
  check_backward(shape_case(f, 129, 65, 64, 64, 4, 2), 241);
  check_backward(shape_case(f, 127, 191, 33, 17, 6, 3, 2), 242);
  BackwardCase d = shape_case(f, 300, 1000, 64, 48, 2, 1);
  d.options.deterministic = true;
  d.sinks = true;
  check_backward(d, 243, /*twice=*/true);
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
    for (auto [lq, lk] : {std::pair{257, 129}, std::pair{129, 257}, std::pair{200, 200}}) {
      BackwardCase m = shape_case(f, lq, lk, 64, 64, 4, 2);
      m.options.causal = true;
      m.options.causal_alignment = align;
      m.sinks = lq == 200;
      check_backward(m, 244);
    }
    BackwardCase w = shape_case(f, 333, 301, 40, 40, 2, 2);
    w.options.window_left = 70;
    w.options.window_right = 5;
    w.options.causal_alignment = align;
    check_backward(w, 245);
  }
  BackwardCase n = shape_case(f, 150, 90, 64, 64, 2, 1);
  n.options.scale = -0.3f;
  n.q_layout.order = {0, 2, 1, 3};
  n.kv_layout.pad = 3;
  n.grad_layout.pad = 1;
  check_backward(n, 246);
  BackwardCase e = shape_case(f, 300, 90, 64, 64, 2, 1);
  e.options.window_left = 0;
  e.options.window_right = 0;
  e.sinks = true;
  check_backward(e, 247);  // query rows 90-299 see no key, whole dQ blocks without a key tile
  BackwardCase k = shape_case(f, 90, 300, 64, 64, 2, 1);
  k.options.causal = true;
  check_backward(k, 248);  // keys 90-299 seen by no query: whole dK/dV blocks without a query tile
}

// A scale <= 0 on dense batches that tensor maps describe: the warp-specialized kernels (D 64 /
// 128 fused, D 256 fused and split) fold a positive scale into their exponentials after masking
// raw scores, so these problems must take the other kernels (a masked -inf times a negative scale
// was +inf: NaN gradients). Causal and a partial last tile, so masked scores exist.
TEST(CudaBackward, NonPositiveScaleOnTensorMapRows) {
  SKIP_WITHOUT_GPU();
  for (std::int64_t dim : {64, 128, 256}) {
    BackwardCase c = shape_case(DType::kBFloat16, 200, 200, dim, dim, 2, 1);
    c.options.scale = -0.5f;
    c.options.causal = true;
    check_backward(c, 250 + dim / 64);
    c.options.causal = false;
    c.options.scale = 0.0f;
    c.dtype = DType::kFloat16;
    check_backward(c, 260 + dim / 64);
  }
}

TEST(CudaBackward, RefusesDeterministicBroadcastBiasGradient) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 17, 17, 64, 64, 2, 1, 2);
  c.bias = true;
  c.dbias = true;
  c.bias_broadcast = {true, false, false, false};
  c.options.deterministic = true;
  std::mt19937_64 rng(5);
  Tensors t = make_tensors(c, c.dtype, DType::kFloat32, &rng);
  DeviceTensors dev;
  dev.upload(t);
  if (::testing::Test::HasFatalFailure()) return;
  const fmha::Status s = run_backward(c, dev.views(), BackwardImpl::kAuto);
  EXPECT_EQ(s.code(), fmha::StatusCode::kNotSupported);
  EXPECT_NE(s.message().find("CUDA backward does not support deterministic=true with grads.dbias"),
            std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace fmha_cuda_test
