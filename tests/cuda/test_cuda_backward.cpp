// The CUDA backward (sm80 mma.sync kernels, fused and split) against the CPU reference: the CUDA
// forward makes out and lse on the GPU, the CUDA backward turns dout (and dlse) into every
// gradient, and each gradient is compared with fmha::run of the backward on float64 CPU copies
// (the forward recomputed in float64 too) within SPEC §13's bound: 2 x the error of the naive
// same-dtype computation (tests/naive with S, P, dP, dS rounded to the dtype) + 1e-4, plus the
// error of merely storing the exact gradient in its dtype. Outputs are poisoned with NaN first.
//
// This file: shapes, layouts, masks, varlen and determinism; test_cuda_backward_features.cpp: score
// options, bias, rel-pos, sinks, extra keys and fp32.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>

#include "cuda_backward_case.h"

namespace fmha_cuda_test {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device present"

TEST(CudaBackward, OddShapesAndHeadDims) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    check_backward(shape_case(dt, 1, 1, 64, 64, 2, 1), 1);
    check_backward(shape_case(dt, 17, 113, 40, 40, 8, 2), 2);
    check_backward(shape_case(dt, 113, 17, 80, 80, 4, 1, 2), 3);
    check_backward(shape_case(dt, 239, 113, 128, 128, 8, 2), 4);
    check_backward(shape_case(dt, 113, 239, 256, 256, 4, 1), 5);
    check_backward(shape_case(dt, 64, 128, 64, 64, 2, 2, 2), 6);
  }
}

TEST(CudaBackward, ValueDimDiffersFromHeadDim) {
  SKIP_WITHOUT_GPU();
  check_backward(shape_case(DType::kFloat16, 113, 239, 128, 64, 4, 2), 11);
  check_backward(shape_case(DType::kBFloat16, 239, 113, 64, 128, 4, 1), 12);
  check_backward(shape_case(DType::kFloat16, 17, 239, 40, 256, 8, 2), 13);
  check_backward(shape_case(DType::kBFloat16, 33, 65, 160, 40, 2, 2), 14);
  check_backward(shape_case(DType::kFloat16, 40, 41, 200, 72, 2, 1), 15);
}

// Head dims that are not multiples of 8 take the element-wise load path.
TEST(CudaBackward, HeadDimsNotMultipleOf8) {
  SKIP_WITHOUT_GPU();
  check_backward(shape_case(DType::kFloat16, 17, 113, 1, 1, 2, 1), 21);
  check_backward(shape_case(DType::kBFloat16, 113, 17, 3, 5, 4, 1), 22);
  check_backward(shape_case(DType::kFloat16, 65, 70, 100, 36, 4, 2), 23);
}

TEST(CudaBackward, StridedLayoutsScaleAndNoDlse) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 113, 239, 64, 64, 4, 2, 2);
  c.q_layout.order = {0, 2, 1, 3};  // q and dout stored [B, H, L, D]
  c.kv_layout.pad = 8;
  c.grad_layout.pad = 8;
  check_backward(c, 31);
  c.kv_layout.pad = 3;  // unaligned rows: element-wise loads
  c.grad_layout.pad = 1;
  c.options.scale = 0.3f;
  c.dlse = false;
  c.dtype = DType::kBFloat16;
  check_backward(c, 32);
}

TEST(CudaBackward, CausalBothAlignments) {
  SKIP_WITHOUT_GPU();
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight})
    for (auto [lq, lk] : {std::pair<int, int>{113, 239}, {239, 113}, {128, 128}, {1, 239}}) {
      BackwardCase c = shape_case(DType::kFloat16, lq, lk, 64, 64, 8, 2);
      c.options.causal = true;
      c.options.causal_alignment = align;
      check_backward(c, 51);
    }
  BackwardCase c = shape_case(DType::kBFloat16, 239, 239, 128, 128, 4, 1);
  c.options.causal = true;
  check_backward(c, 52);
}

// Causal rows of 8 tiles or more: the sm90 kernels' blocks start in head sections
// (block_coords.cuh), 2^k heads interleaved: 4 heads (sections of 4), GQA 6 / 2 heads (the dK/dV
// grid's 2 kv heads and the forward's 6 in sections of 2), bottom-right with Lq != Lk, and D 256
// (the dK and dV kernels).
TEST(CudaBackward, CausalHeadSections) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kBFloat16, 1100, 1100, 64, 64, 4, 4, 2);
  c.options.causal = true;
  check_backward(c, 53);
  c = shape_case(DType::kFloat16, 1030, 1300, 64, 64, 6, 2, 1);
  c.options.causal = true;
  c.options.causal_alignment = CausalAlignment::kBottomRight;
  check_backward(c, 54);
  c = shape_case(DType::kBFloat16, 1030, 1030, 256, 256, 2, 2, 1);
  c.options.causal = true;
  check_backward(c, 55);
}

// Rows long enough that the sm90 kernels' stage rings wrap several times under ping-pong, where
// the follower reads tile u's stage after rendezvous u + 1 and the loads issued there go one tile
// ahead (mainloop_bwd_dq.cuh): the dK/dV kernel's plain policy at D 64 (8 query steps of 96), the
// dQ kernel's plain and window (causal) policies at D 64 and D 128 (9 and 18 key tiles of 128 /
// 64), and its bias policy's staged tiles (rows of whole 16-byte chunks, Lk % 8 == 0) with a bias
// shared by the batches. Partial last tiles on both sides.
TEST(CudaBackward, PingPongManyTiles) {
  SKIP_WITHOUT_GPU();
  for (int d : {64, 128}) {
    BackwardCase c = shape_case(DType::kBFloat16, 700, 1088, d, d, 4, 2, 1);
    check_backward(c, d == 64 ? 241 : 242);
    c.options.causal = true;
    c.options.causal_alignment = CausalAlignment::kBottomRight;
    check_backward(c, d == 64 ? 243 : 244);
  }
  BackwardCase b = shape_case(DType::kFloat16, 700, 1088, 64, 64, 4, 2, 2);
  b.bias = true;
  b.bias_broadcast = {true, false, false, false};  // [1, H, Lq, Lk]
  check_backward(b, 245);
}

// On Hopper the split backward's dQ kernel starts while its dK/dV kernel still runs, and each dQ
// block waits for the dK/dV kernel's completion on its way out (sm90/grid_dependency.cuh), so that
// what the stream runs next finds dK and dV written. MQA over 32 query heads makes the dK/dV blocks
// long (each walks every head: 2 blocks of 352 steps) and the dQ blocks short (256 blocks of 2 key
// tiles): were the dQ grid free to finish first, the copies queued behind would catch dk and dv
// poisoned. The fused backward (one kernel and a conversion) is checked alike.
TEST(CudaBackward, GradientsCompleteForWorkQueuedBehind) {
  SKIP_WITHOUT_GPU();
  check_gradients_queued_behind(shape_case(DType::kBFloat16, 1024, 256, 64, 64, 32, 1), 251);
}

TEST(CudaBackward, WindowsAndFullyMaskedRows) {
  SKIP_WITHOUT_GPU();
  struct W {
    std::int64_t left, right;
    bool causal;
  };
  for (auto align : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight})
    for (W w :
         {W{16, 0, false}, W{-1, 5, false}, W{3, 7, true}, W{100, -1, false}, W{0, 0, false}}) {
      BackwardCase c = shape_case(DType::kFloat16, 239, 113, 96, 96, 4, 2);
      c.options.window_left = w.left;
      c.options.window_right = w.right;
      c.options.causal = w.causal;
      c.options.causal_alignment = align;
      check_backward(c, 61);  // bottom-right with Lq > Lk leaves the first rows fully masked
    }
  // Lk = 0: every row fully masked, dq = 0; Lq = 0: dk = dv = 0.
  check_backward(shape_case(DType::kBFloat16, 17, 0, 64, 64, 2, 1), 62);
  check_backward(shape_case(DType::kFloat16, 0, 17, 64, 64, 2, 1), 63);
}

// Head dims above 128: on sm90 dK and dV come from two kernels (one accumulating each) with 32-row
// tiles, or at bucket 256 from the warp-specialized kernel (its plain policy splitting S and dP by
// product, the window policy by keys), and dQ from 48-key tiles under a range mask alone; no mask,
// masks, GQA, Dv != D and the deterministic path across them.
TEST(CudaBackward, WideHeadsWithMasksAndGqa) {
  SKIP_WITHOUT_GPU();
  for (auto [d, dv] : {std::pair<int, int>{192, 192}, {256, 128}, {144, 256}, {256, 256}}) {
    BackwardCase c = shape_case(DType::kBFloat16, 239, 177, d, dv, 8, 2, 2);
    check_backward(c, 64);
    c.options.causal = true;
    c.options.causal_alignment = CausalAlignment::kBottomRight;
    check_backward(c, 65);
    c.options.causal = false;
    c.options.window_left = 37;
    c.options.window_right = 11;
    c.sinks = true;
    c.dtype = DType::kFloat16;
    check_backward(c, 66);
  }
  BackwardCase c = shape_case(DType::kBFloat16, 130, 301, 256, 256, 4, 1);
  c.options.causal = true;
  c.options.deterministic = true;
  check_backward(c, 67, /*twice=*/true);
}

TEST(CudaBackward, Varlen) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kFloat16, 0, 0, 64, 64, 4, 2);
  c.varlen_q = {17, 0, 113, 64, 1};
  c.varlen_k = {33, 5, 113, 0, 70};
  check_backward(c, 111);
  c.options.causal = true;
  c.options.causal_alignment = CausalAlignment::kBottomRight;
  c.sinks = true;
  c.extra = 3;
  c.bias = true;
  c.dbias = true;
  c.dtype = DType::kBFloat16;
  check_backward(c, 112);
}

// On sm90, backward_impl = fused at head-dim buckets 64 and 128 runs the warp-specialized fused
// kernel where it applies (dense, no score modifier but softcap alone: FusedWarpSpecialized below)
// and elsewhere the dK/dV kernel that adds dQ with bulk reductions by column (fused_dq.cuh), next
// to the split kernels: GQA, masks, a bias without dbias (the register-form policy), softcap (the
// warp-specialized kernel's softcap policy; at D 100 / 120, rows off 16 bytes, the by-column
// kernel's general policy), head dims inside the buckets, several query tiles and key blocks;
// varlen with odd sequence starts adds single floats instead of pairs.
TEST(CudaBackward, FusedAtBuckets64And128) {
  SKIP_WITHOUT_GPU();
  for (auto [d, dv] : {std::pair<int, int>{64, 64}, {48, 64}, {128, 128}, {100, 120}}) {
    BackwardCase c = shape_case(DType::kBFloat16, 239, 577, d, dv, 8, 2, 2);
    c.options.causal = true;
    c.options.causal_alignment = CausalAlignment::kBottomRight;
    check_backward(c, 71);
    c.options.causal = false;
    c.bias = true;
    c.dtype = DType::kFloat16;
    check_backward(c, 72);
    c.bias = false;
    c.options.softcap = 15.0f;
    c.sinks = true;
    check_backward(c, 73);
  }
  // Bias rows of whole 16-byte chunks are staged, and at D 64 dS^T then takes the bias tile of its
  // stage: the bias policy alone, and the general one with softcap.
  for (int d : {64, 40}) {
    BackwardCase b = shape_case(DType::kBFloat16, 200, 320, d, d, 8, 2, 2);
    b.bias = true;
    check_backward(b, 76);
    b.options.softcap = 20.0f;
    b.options.causal = true;
    check_backward(b, 77);
  }
  BackwardCase c = shape_case(DType::kBFloat16, 0, 0, 128, 128, 4, 2);
  c.varlen_q = {17, 0, 113, 64, 1, 200};
  c.varlen_k = {33, 5, 113, 0, 70, 150};
  c.options.window_left = 40;
  c.options.window_right = 9;
  check_backward(c, 74);
  c.head_dim = c.value_dim = 64;
  c.options.causal = true;
  check_backward(c, 75);
}

// The warp-specialized fused sm90 backward (mainloop_bwd_fused.cuh; backward_impl fused and auto
// on Hopper for dense batches without score modifiers at buckets 64 and 128): rows long enough
// that its two Q / dO stages and dS^T tiles wrap many times, the GQA group's heads walked by one
// key block, causal both alignments (bottom-right with Lq > Lk leaves rows fully masked), windows,
// head dims inside the buckets and Dv != D, sinks and dlse, several batches; the split kernels
// alongside as the reference's second opinion.
TEST(CudaBackward, FusedWarpSpecialized) {
  SKIP_WITHOUT_GPU();
  for (auto [d, dv] : {std::pair<int, int>{64, 64}, {128, 128}, {48, 64}, {128, 64}, {96, 128}}) {
    BackwardCase c = shape_case(DType::kBFloat16, 700, 1088, d, dv, 8, 2, 2);
    c.impls = {BackwardImpl::kAuto, BackwardImpl::kFused, BackwardImpl::kSplit};
    check_backward(c, 131);
    c.options.causal = true;
    c.options.causal_alignment = CausalAlignment::kBottomRight;
    c.sinks = true;
    c.dtype = DType::kFloat16;
    check_backward(c, 132);
    c.seqlen_q = 1088;
    c.seqlen_k = 700;
    check_backward(c, 133);
    c.options.causal = false;
    c.options.window_left = 100;
    c.options.window_right = 37;
    c.sinks = false;
    c.dlse = false;
    check_backward(c, 134);
  }
  // MQA over 16 query heads: one key block walks every head's query tiles.
  BackwardCase m = shape_case(DType::kBFloat16, 300, 257, 128, 128, 16, 1);
  m.options.causal = true;
  check_backward(m, 135);
  // Deterministic: the dQ adds in key-block order (turn counters), the same bits twice.
  for (int d : {128, 64}) {
    BackwardCase t = shape_case(DType::kBFloat16, 577, 700, d, d, 8, 2, 2);
    t.options.causal = d == 128;
    t.options.deterministic = true;
    t.sinks = true;
    t.impls = {BackwardImpl::kAuto, BackwardImpl::kFused};
    check_backward(t, 136, /*twice=*/true);
  }
}

TEST(CudaBackward, DeterministicRunTwice) {
  SKIP_WITHOUT_GPU();
  BackwardCase c = shape_case(DType::kBFloat16, 239, 577, 128, 128, 8, 2);
  c.options.causal = true;
  c.options.deterministic = true;
  c.sinks = true;
  c.extra = 5;
  c.bias = true;
  c.dbias = true;                                         // full size: one contribution per element
  c.impls = {BackwardImpl::kAuto, BackwardImpl::kFused};  // deterministic overrides fused
  check_backward(c, 121, /*twice=*/true);
}

}  // namespace
}  // namespace fmha_cuda_test
