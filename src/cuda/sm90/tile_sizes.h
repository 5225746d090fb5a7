// Tile-size choices of the sm90 (wgmma) forward kernel, one place, each with its reason.
// Head-dim buckets are the sm80 kernel's (multiples of 32, cuda/sm80/tile_sizes.h).
#pragma once

namespace fmha::cuda::sm90 {

// Two warpgroups of 4 warps; each owns 64 query rows (one m64 wgmma row block), so a block holds
// 128 queries and loads each K/V tile once for all of them.
inline constexpr int kWarpGroups = 2;
inline constexpr int kThreads = kWarpGroups * 128;
inline constexpr int kBlockM = kWarpGroups * 64;

// Keys per tile: 128 up to D = 128 (the score tile costs kN / 2 floats a thread, 64, next to the
// D / 2 of the output); 64 above, where the output accumulator alone takes up to 128.
constexpr int block_n(int head_dim_bucket) {
  return head_dim_bucket <= 128 ? 128 : 64;
}

// K/V stages: tiles u + 1 .. u + stages - 1 are in flight while tile u is multiplied. Three where
// Q plus three K/V stages fit in the 227 KB a block may have (up to D = 224), two at D = 256. One
// barrier per tile suffices: the stage that tile u + stages - 1 overwrites was last read in
// iteration u - 1, which every warp has left once it passes iteration u's barrier.
constexpr int kv_stages(int head_dim_bucket) {
  return head_dim_bucket < 256 ? 3 : 2;
}

}  // namespace fmha::cuda::sm90
