// Tile-size choices of the sm90 (wgmma) forward kernel, one place, each with its reason.
// Head-dim buckets are the sm80 kernel's (multiples of 32, cuda/sm80/tile_sizes.h).
#pragma once

namespace fmha::cuda::sm90 {

// Warpgroups of 4 warps, each owning 64 query rows (one m64 wgmma row block); a block loads each
// K/V tile once for all of them, and while one warpgroup runs its softmax the other keeps the
// tensor cores busy. Measured on an H100 (bf16, D 64, 16k tokens): three warpgroups (192 rows,
// 96-key tiles, 168 registers) gain 3-9% from L 8192 on but lose 10-20% below L 4096 and under
// causal masks (larger blocks: fewer of them, more masked work on the diagonal), so two; with the
// copy warpgroup and persistent blocks the plain policy takes three up to D 64
// (forward_pipeline.cuh: fwd_warp_groups).
constexpr int warp_groups(int) {
  return 2;
}
constexpr int threads(int head_dim_bucket) {
  return warp_groups(head_dim_bucket) * 128;
}
constexpr int block_m(int head_dim_bucket) {
  return warp_groups(head_dim_bucket) * 64;
}

// Keys per tile: the score tile costs kN / 2 floats a thread next to the D / 2 of the output.
// 128 up to D = 128; 64 above, where the output accumulator alone takes up to 128. Measured on an
// H100 (bf16, D 64, plain, 16k tokens): 192-key tiles gain 3-6% from L 4096 on but lose 8-9% at
// L 512-1024 (a partial last tile), and spill under a mask, so 128.
constexpr int block_n(int head_dim_bucket) {
  return head_dim_bucket <= 128 ? 128 : 64;
}

// K/V stages: tiles u + 1 .. u + stages - 1 are in flight while tile u is multiplied. Three where
// Q plus three K/V stages fit in the 227 KB a block may have (up to D = 224), two at D = 256. One
// barrier per tile suffices: the stage that tile u + stages - 1 overwrites was last read in
// iteration u - 1, which every warp has left once it passes iteration u's barrier.
// The score-modifier policy keeps two above D = 64, where its bias tiles (below) take the third
// stage's room; up to D = 64 three fit beside them (SAM rel-pos D 64 on an H100: 119 TFLOP/s with
// three, 117 with two, within noise).
constexpr int kv_stages(int head_dim_bucket, bool modifiers) {
  return head_dim_bucket < 256 && (!modifiers || head_dim_bucket <= 64) ? 3 : 2;
}

// Whether the forward's P V product drops the bucket's last 16 output columns when the value dim
// leaves them empty (N = D - 16), as S = Q K^T drops its last k-step when the head dim does: in
// bucket 96 only, where SAM-H's head dim 80 lives (the 64 x 80 wgmma is the only such shape that
// wgmma_ops.cuh generates). At D 80 that is a sixth of P V's work.
constexpr bool narrow_pv(int head_dim_bucket) {
  return head_dim_bucket == 96;
}

// A staged bias tile: the block's rows x one key tile of 16-bit values, 16-byte chunks of each
// row swizzled by the row's index modulo 8 (the 8 rows x 4 pair loads of a warp's fragment fall
// in 32 different banks).
constexpr int bias_tile_bytes(int head_dim_bucket) {
  return block_m(head_dim_bucket) * block_n(head_dim_bucket) * 2;
}

// Ping-pong between the two warpgroups (mainloop_fwd.cuh): warpgroup 1 issues its products while
// warpgroup 0 runs its softmax and the reverse, instead of both computing exponentials at once and
// then both waiting for the tensor cores. At D 64 with 128-key tiles the exponentials of a tile
// (16 a clock per SM) take as long as its two products, so overlapping them is worth up to 2x
// there; above, the products dominate and the gain shrinks to the softmax's share. Measured on an
// H100 (bf16, 16k tokens): D 64 forward +9 to +15% (259 -> 296 TFLOP/s at L 4096). Up to D 128,
// masks included since partial tiles test one column interval a row (mask_policies.cuh; the
// per-element test spilled 124 bytes at D 128 with it); above, the output accumulator leaves no
// room without a copy warpgroup, and with one it does not pay (H100, 2026-11-28, D 256 plain:
// level at L 512, 1-3% slower from L 2048). Policies that stage per-tile data for the softmax (the score modifiers' bias tiles)
// never ping-pong: the follower's softmax of tile u runs after the rendezvous that frees tile u's
// stage.
constexpr bool ping_pong(int head_dim_bucket) {
  return head_dim_bucket <= 128;
}

// Whether a warpgroup runs the softmax of tile u under its own P(u - 1) V(u - 1) (mainloop_fwd.cuh:
// S(u) issued first in a group of its own and waited for alone; O rescaled once the product has
// landed), on top of ping-pong between the warpgroups, as FlashAttention-3's forward does. The
// packed P(u - 1) stays in registers through the softmax; the range policies without score
// modifiers only (the general, bias and rel-pos forms are at their register limit).
constexpr bool overlap_softmax(int) {
  return true;
}

// Where an overlapped phase waits for its P(u - 1) V(u - 1) (mainloop_fwd.cuh): after the softmax
// of tile u, so that the exponentials run under the product. Written plainly after the softmax, the
// wait is moved by ptxas (CUDA 13.0, every head dim) up to just after the wait for S(u): the
// exponentials then start only once P V has landed. In each arm of a branch that follows the
// softmax (the warp's vote on O's rescale) it stays. Worth it where P V is long beside the
// softmax: unmasked D 256 2.5-4.4% faster from L 2048, D 128 1.8% at L 8192 (H200, kernels alone,
// bf16, five alternating rounds). At D 64 - 96, and under masks, the early wait lets ptxas pack P
// between the exponentials, which the late one leaves after them: 1-7% slower there (D 80 causal
// L 8192 -5.5%), so those keep ptxas's placement.
constexpr bool pv_wait_after_softmax(int head_dim_bucket, bool masked) {
  return head_dim_bucket >= 128 && !masked;
}

}  // namespace fmha::cuda::sm90
