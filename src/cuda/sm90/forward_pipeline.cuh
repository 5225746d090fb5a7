// The sm90 forward kernel's schedules (mainloop_fwd.cuh): who copies Q, K and V into the shared-
// memory stages, how the math warpgroups learn that a stage has landed and hand it back, and how
// the two math warpgroups take turns on the tensor cores. Which one a kernel runs is a property of
// its (head-dim bucket, policy): kCopyWarpgroup below.
//
// With a copy warpgroup (range tiles of the plain, window, rel-pos and bias policies, and the
// token tiles of neighborhood attention without score modifiers, up to D 128; above, range tiles
// of the plain and window policies).
// The block has a third warpgroup (threads 256..383) that does nothing but copy, and keeps 40
// registers so that the math warpgroups can have 232 (setmaxnreg; ptxas gives each branch of the
// role split its own budget). It copies Q, then group j = K(j), V(j - 1) into stage slot j %
// stages, once the slot's `empty` barrier says that the math warps have finished phase j - stages,
// its last reader; the slot's `full` barrier completes when the group has landed
// (tile_copies.cuh); the bias policy's tiles go into a ring of their own (bias_ring(), below).
// Q and the main key tiles of a dense batch go through the tensor-memory
// accelerator: one thread issues one cp.async.bulk.tensor per column block of a tile (the launcher
// makes the tensor maps); extra keys, varlen sequences and strides no tensor map can describe go
// through the copy threads' cp.async, as in the other schedule. A math warpgroup's phase u waits
// for full[u % stages] (and Q before phase 0), fences the proxies where cp.async wrote the tiles
// (the tensor cores read through the async proxy), and after the phase's wgmma group has landed
// each of its warps arrives on empty[u % stages]. No barrier joins all 384 threads after the role
// split, and the math warps never issue a copy.
// Ping-pong: the leader issues phase u once the follower has issued phase u - 1 (kTurnBackBarrier)
// and the follower issues phase u once the leader has (kTurnBarrier): the wgmma groups of the two
// warpgroups alternate, so each one's softmax runs under the other's products. Phases are counted
// over all the block's grid tiles (below): the leader arrives on kTurnBarrier once a phase and the
// follower waits as often; the follower arrives on kTurnBackBarrier after every phase and the
// leader waits before every phase but the block's first, and once more at its end. Measured on an
// H200 (2026-11-26, bf16, against the schedule below, same inputs): D 64 forward 1.21 -> 1.06 ms
// at SAM-B (B 8, H 12, L 4096), +6% at L 512 and +12-13% from L 2048; D 128 +4% at L 512 and
// +12-17% from L 2048.
// Persistent blocks: the launcher starts at most one block an SM, and each walks grid tiles
// (round robin, or one by one from a counter where their work differs: mainloop_fwd.cuh). Stage
// slots and barrier parities run on from tile to tile; Q's tile is refilled once its last reader
// is done (q_empty), by TMA after the next tile's K(0); the output is staged in a tile of its own
// where shared memory has room (output_tile(), up to D 128), or a column block at a time in each
// warp's output chunks (output_chunks(), D 192 and 256), so that the next tile's Q and first
// K / V groups land under the previous tile's last phase and epilogue. Measured on an H200
// (2026-11-26, against the kernel before, a block a tile, same inputs): D 64 L 512 0.290 -> 0.243
// ms, causal L 512 0.246 -> 0.204; D 80 (bucket 96) L 512 0.307 -> 0.228, SAM-H's shape 1.71
// -> 1.60; D 128 L 512 0.186 -> 0.170; from L 2048 on -3% (D 128 L 8192) to +21% (D 80 causal
// L 2048).
//
// Token tiles (neighborhood attention) with a copy warpgroup: the copy threads also stage each
// grid tile's boxes (token_tiles.cuh): the query box (its tiles, rows' tokens and windows) into
// one of two buffers, by tile parity, once the math warps' epilogue of the tile two before has left
// it (query_box_empty), then key box 0, then with group j key box j + 1 into the key-box ring
// (slot = the block's phase count, as stage slots), each published to the other copy threads by
// their named barrier (kCopyBarrier) and to the math warps by a plain arrival (release) on Q's or
// the group's barrier beside the one after their copies, so those barriers take two arrivals a
// copy thread. The math warps wait for Q's barrier before anything else of a grid tile: it gives
// them the number of key boxes. So the per-block set-up of the token tiles (box geometry, tokens
// and windows, gathers of Q) runs under the previous grid tile's products. Measured on an H200
// (2026-11-27, bf16, against the schedule below, na suite): NA 2-D 64x64 K 13 D 64 forward 39.1 ->
// 51.3 TFLOP/s, K 7 dilation 2 13.1 -> 15.6, 3-D 16x32x32 K 7 38.2 -> 46.2; D 128 58.0 -> 70.9,
// 19.6 -> 23.6, 57.0 -> 58.4.
//
// Without a copy warpgroup (neighborhood attention with score modifiers, the score modifiers'
// general policy, and above D 128 the bias and rel-pos register forms and token tiles, whose math
// warpgroups need every register of a 256-thread block):
// copies are issued by all threads with cp.async in groups: group j = K(j) (and its bias tile)
// and V(j - 1); groups 0 .. stages - 2 before the loop, group u + stages - 1 right after
// rendezvous u. Rendezvous u (named barrier kPipelineBarrier, all threads; each thread first
// waits for its own copies of group u and fences them for the async proxy) publishes group u and
// certifies that every warp has waited for its phase u - 1, the last reader of the stages that
// group u + stages - 1 overwrites (K(u - 1), V(u - 2)).
//
// Ping-pong (kPingPong: tile_sizes.h's ping_pong(D), for every policy but the score
// modifiers'). Warpgroup 0, the leader, and warpgroup 1, the follower, meet at rendezvous u at
// different points of their own work:
//   leader:    R(u)  issue phase u  arrive(turn)  wait               softmax u   | R(u + 1) ..
//   follower:                       sync(turn)    issue phase u wait  R(u + 1)  softmax u ..
// (the follower runs R(0) before its loop). So the leader issues phase u + 1 only once the
// follower's phase u has landed (R(u + 1) comes after the follower's wait), and the follower
// issues phase u only after the leader did (the turn barrier, kTurnBarrier: 128 arrivals plus 128
// waiters), and in steady state each warpgroup's softmax runs under the other's products. Without
// ping-pong both warpgroups run the leader's line without the turn barrier.
// Deadlock freedom: both lines run R(0) .. R(num_tiles) once each, in order (the follower R(u + 1)
// only while u + 1 <= num_tiles), the leader arrives num_tiles + 1 times at the turn barrier and
// the follower waits as often; the leader's arrival for phase u + 1 follows R(u + 1), which
// follows the follower's wait for phase u, so a turn barrier generation is never joined early.
// Every quantity that picks a branch (num_tiles, main_tiles, the varlen early exit before any
// barrier) is the same for the whole block, so no warp skips a barrier that another waits at: a
// block without key tiles (causal rows past the keys, an empty varlen sequence) runs no phase and
// no rendezvous; one tile runs phases 0 (S) and 1 (P V).
// Lifetimes the follower's lag adds: its softmax of tile u runs after R(u + 1), whose copies
// overwrite the stages of K(u) and V(u - 1): it reads neither (S(u) is in registers), but a staged
// bias tile of tile u would be overwritten, hence no ping-pong for the score modifiers; token-tile
// key boxes keep a ring of stages + 2 (TokenTileSmem).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/block_coords.cuh"
#include "cuda/common/env_switch.h"
#include "cuda/common/forward_policies.cuh"
#include "cuda/sm90/policy_forms.h"
#include "cuda/sm90/tile_copies.cuh"
#include "cuda/sm90/tile_sizes.h"
#include "cuda/sm90/tiles.cuh"

namespace fmha::cuda::sm90 {

// Policies whose staged rows or tiles take shared memory besides the K/V stages.
template <typename Policy>
inline constexpr bool kStagesScores = kGeneralForm<Policy>;

// Whether a copy warpgroup feeds the stages (above): the policies whose softmax reads nothing
// staged per tile, where the math warpgroups keep enough registers beside it: up to D 128 all of
// them but neighborhood attention with score modifiers (bias and rel-pos by token), which spilled
// 500 bytes at D 128 with one (ptxas, 2026-11-27); above, the plain and window policies on range
// tiles, whose output accumulator (up to 128 registers) and overlapped softmax fit in 224.
// Measured on an H100 (2026-11-28, bf16, D 256, kernel alone, against all threads copying, a block
// a tile): L 512 366 -> 434 TFLOP/s, L 2048 489 -> 628, L 8192 527 -> 687, causal L 512 233 ->
// 252, causal L 2048 409 -> 521. Ping-pong on top of it: level to 3% slower (tile_sizes.h).
template <int kD, typename Policy>
inline constexpr bool kCopyWarpgroup =
    !kGeneralForm<Policy> && !kNeighborhoodModifiersForm<Policy> &&
    (kD <= 128 || (!Policy::Mask::kTokenTiles && !kBiasForm<Policy> && !kRelPosForm<Policy>));
// Whether the copy warpgroup also stages the bias of each main key tile (the bias policy's
// staged form, score_bias.cuh), by TMA into a ring of kBiasStages tiles that the math warps'
// softmax reads and hands back (bias_full / bias_empty); where no tensor map describes the bias
// the kernel keeps the register form. Up to D 64, where the ring fits beside the K/V stages and
// the output tile (208 of the 227 KB).
template <int kD, typename Policy>
constexpr bool bias_ring() {
  return kBiasForm<Policy> && kCopyWarpgroup<kD, Policy> && kD <= 64;
}
inline constexpr int kBiasStages = 2;
// The KV-cache policies (policy_forms.h: kCacheForm) read their keys in the copy warpgroup.
static_assert(kCopyWarpgroup<256, PolicyCache> && kCopyWarpgroup<256, PolicyCacheSoftcap>,
              "the KV-cache policies run with a copy warpgroup at every head dim");
// Math warpgroups of a forward kernel: tile_sizes.h's two, or three (192 query rows, one copy
// warpgroup) for the plain policy up to D 64, where a tile's exponentials take as long as its
// products and two warpgroups, two math warps a scheduler, leave the tensor cores idle about
// half of the time. Measured on an H100 (2026-11-28, bf16, D 64, kernel alone, against two in
// ping-pong): L 512 298 -> 329 TFLOP/s, L 2048 380 -> 475, L 8192 406 -> 503, SAM-B 392 -> 511.
// Under masks the causal forward lost 17% at L 512 (192-row tiles hold more masked work on the
// diagonal, and three warpgroups run without ping-pong), 3% at L 2048, so the window policy keeps
// two; PolicyWindowLongRows, its copy on three, is for longer rows (wide_window_min_rows below),
// where the diagonal is a small share of a row's tiles and the plain policy gains 20-25%.
template <int kD, typename Policy>
constexpr int fwd_warp_groups() {
  return kD <= 64 && (std::is_same_v<Policy, PolicyPlain> ||
                      std::is_same_v<Policy, PolicyWindowLongRows>)
             ? 3
             : warp_groups(kD);
}
template <int kD, typename Policy>
constexpr int fwd_block_m() {
  return fwd_warp_groups<kD, Policy>() * 64;
}
template <int kD, typename Policy>
constexpr int fwd_threads() {  // the math threads
  return fwd_warp_groups<kD, Policy>() * 128;
}
// Keys per tile of a forward kernel: tile_sizes.h's block_n, or 80 for plain attention over long
// rows at D 256 (PolicyPlainLongRows, two stages: 224 of the 227 KB), where S = Q K^T at n 64, both
// operands in shared memory, needs about as many bytes a clock as the SM's shared memory delivers
// and n 80 reads Q a fifth less often. Measured on an H100 (2026-11-28, bf16, kernel alone, against
// 64-key tiles): L 2048 628 -> 656 TFLOP/s, L 8192 682-692 -> 713, SAM-B's shape 615-632 -> 720;
// L 512 434 -> 400 (a last tile of 32 keys in 80), hence from kLongRowKeys keys on. It passes the
// forward tests (gpu-check's long-rows step: H100 and H200, 2026-11-28), but a later side-by-side
// run of the kernels alone on an H200 found it level (L 2048 0.425 -> 0.421 ms, L 8192 1.556 ->
// 1.573), so it is taken only with FMHA_SM90_LONG_ROWS=1 (read once).
template <int kD, typename Policy>
constexpr int fwd_block_n() {
  return kD == 256 && std::is_same_v<Policy, PolicyPlainLongRows> ? 80 : block_n(kD);
}
inline constexpr std::int64_t kLongRowKeys = 1024;
inline bool long_row_tiles_enabled() {
  static const bool enabled = switched_on_by_env("FMHA_SM90_LONG_ROWS");
  return enabled;
}

// The query rows from which a causal or windowed forward up to D 64 runs PolicyWindowLongRows, when
// each row's band of keys is at least as long. H200 (2026-11-28, causal D 64, kernels alone): level
// at L 2048 (0.422 ms against 0.420 on two warpgroups), 3% faster at L 4096 and 10% at L 8192
// and 16384 (in process: 0.91 -> 1.00x cuDNN at L 16384), hence 4096. FMHA_SM90_WIDE_WINDOW=<rows>
// sets it (=1 sends every causal or windowed call there, for the tests), =0 turns it off; read once.
inline constexpr std::int64_t kWideWindowRows = 4096;
inline std::int64_t wide_window_min_rows() {
  static const std::int64_t rows = [] {
    if (switched_off_by_env("FMHA_SM90_WIDE_WINDOW")) return std::int64_t{0};
    const std::int64_t from_env = count_from_env("FMHA_SM90_WIDE_WINDOW");
    return from_env > 0 ? from_env : kWideWindowRows;
  }();
  return rows;
}

// Threads of a forward block: the math warpgroups, and the copy warpgroup after them.
inline constexpr int kCopyThreads = 128;
template <int kD, typename Policy>
constexpr int block_threads() {
  return fwd_threads<kD, Policy>() + (kCopyWarpgroup<kD, Policy> ? kCopyThreads : 0);
}
// Registers a thread of each role keeps (setmaxnreg): 128 x 40 + 256 x 232 of the 65536. Measured
// against 24 / 240 on an H200 (2026-11-26): D 64 1-3% slower, D 128 level to 5% slower at L 512,
// with the copy threads' loaders spilled more.
inline constexpr int kCopyRegisters = 40;
inline constexpr int kMathRegisters = 232;
// Token tiles: 128 x 56 + 256 x 224, as the copy threads also stage the boxes (above). ptxas
// (2026-11-27, NA D 128): 40 / 232 left 51 spill instructions in the copy threads, 56 / 224 10
// and none in the math threads, 64 / 216 15 and 2 in the math threads.
inline constexpr int kTokenCopyRegisters = 56;
inline constexpr int kTokenMathRegisters = 224;
// Above D 128 as token tiles: the copy threads (range loaders at four rows a pass) spilled 900
// bytes at 40 registers, 610 at 56 (ptxas, D 256; the math threads none at 224).
// Three math warpgroups: 128 x 24 + 384 x 160 (ptxas, 2026-11-28, D 64 plain: no spill in the math
// threads).
inline constexpr int kWideCopyRegisters = 24;
inline constexpr int kWideMathRegisters = 160;
template <int kD, typename Policy>
constexpr int copy_registers() {
  if constexpr (fwd_warp_groups<kD, Policy>() == 3) return kWideCopyRegisters;
  return Policy::Mask::kTokenTiles || kD > 128 ? kTokenCopyRegisters : kCopyRegisters;
}
template <int kD, typename Policy>
constexpr int math_registers() {
  if constexpr (fwd_warp_groups<kD, Policy>() == 3) return kWideMathRegisters;
  return Policy::Mask::kTokenTiles || kD > 128 ? kTokenMathRegisters : kMathRegisters;
}

// Whether the first phase issues P V too, with P = 0 against a zeroed V stage, so that it runs
// the same wgmma run as every phase with both products (mainloop_fwd.cuh), or a run of its own
// without P V. The schedule without a copy warpgroup always does (a run more costs the general
// policy spills); with one, it reads a V tile of zeros of its own, zeroed once a block
// (forward_smem.cuh's zero_v_tile: the V stage before a grid tile holds the previous tile's V).
// Measured on an H200 (2026-11-26, against the first phase without P V): D 64 2-5%
// faster from L 2048, D 80 (bucket 96) 1% faster at SAM-H's shape and 5% at L 8192; D 128 slower (L
// 512 0.193 against 0.186 ms, L 8192 1.94 against 1.80).
template <int kD, typename Policy>
inline constexpr bool kFirstPhasePv = !kCopyWarpgroup<kD, Policy> || kD <= 96;

// The mbarriers of a block with a copy warpgroup (tile_copies.cuh): per stage slot `full` (its
// group landed) and `empty` (no math warp reads it any more), and Q's tile.
template <int kStages>
struct StageBarriers {
  std::uint64_t full[kStages];
  std::uint64_t empty[kStages];
  std::uint64_t q_full;   // Q's tile landed
  std::uint64_t q_empty;  // no math warp reads Q any more (a persistent block's next tile's Q)
  // A persistent block's next grid tiles, taken by the copy warpgroup's thread 0 (dynamic
  // schedule): a ring of two, announced (full) and read by every warp (empty).
  std::uint64_t tile_full[2];
  std::uint64_t tile_empty[2];
  unsigned tile[2];
  // The staged bias ring (bias_ring()): bias tile n of the block in slot n % kBiasStages, landed
  // (full: the copying thread's arrival with its TMA bytes) and read by every math thread (empty).
  std::uint64_t bias_full[kBiasStages];
  std::uint64_t bias_empty[kBiasStages];
  // Token tiles: grid tile k's query box in buffer k % 2 (TokenTileSmem), free again once every
  // math warp's epilogue of that tile is done (one arrival a warp).
  std::uint64_t query_box_empty[2];
};

// The range loaders of the threads that copy K and V (all math threads, or the copy warpgroup):
// `thread` is this thread's index among them.
template <int kN, int kD, int kCopiers>
struct KvLoaders {
  using Loader = RangeTileLoader<kN, kD, kCopiers>;
  static constexpr int kThreads = kCopiers;
  Loader k, v;
  int thread;
};

// Sets up the barriers of a block with a copy warpgroup (thread 0; the block barrier after it
// publishes them): a stage's and Q's `full` complete on kCopyArrivals arrivals a copy thread, a
// stage's `empty` on one a math warp, Q's `empty` on one a math thread; the tile ring's on its
// announcing thread and one a warp; the bias ring's (kBiasRing) on the copying thread's and one a
// math thread.
template <int kStages, int kMathThreads, int kCopyArrivals, bool kBiasRing>
__device__ __forceinline__ void init_stage_barriers(StageBarriers<kStages>* bars) {
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    barrier_init(&bars->full[s], kCopyArrivals * kCopyThreads);
    barrier_init(&bars->empty[s], kMathThreads / 32);
  }
  barrier_init(&bars->q_full, kCopyArrivals * kCopyThreads);
  barrier_init(&bars->q_empty, kMathThreads);
  for (int buffer = 0; buffer < 2; ++buffer) {
    barrier_init(&bars->query_box_empty[buffer], kMathThreads / 32);
  }
  for (int slot = 0; slot < 2; ++slot) {
    barrier_init(&bars->tile_full[slot], 1);
    barrier_init(&bars->tile_empty[slot], (kMathThreads + kCopyThreads) / 32);
  }
  if constexpr (kBiasRing) {
    for (int slot = 0; slot < kBiasStages; ++slot) {
      barrier_init(&bars->bias_full[slot], 1);
      barrier_init(&bars->bias_empty[slot], kMathThreads);
    }
  }
  ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
}

// A persistent block's walk over the launch's grid tiles (the launcher starts at most one block an
// SM), from grid tile blockIdx.x on, in the order the hardware would start the tiles' own blocks:
// run_tile(index, grid) for each. Tiles of equal work go round robin: block i takes tiles i, i +
// blocks, ... Under masks that make their work unequal (p.tile_counter set) a block takes the next
// tile not yet taken when it is done with one, as the hardware would start blocks: the copy
// warpgroup's thread 0 takes it (an atomic add on the counter, which the launcher zeroed) once it
// has issued the copies of its current tile, and announces it to the block in a ring of two slots
// (tile ordinal k in slot k % 2, read by lane 0 of every warp). Every thread of the block walks,
// in its role (kCopyRole: the copy warpgroup).
template <bool kCopyRole, int kMathThreads, int kStages, typename RunTile>
__device__ __forceinline__ void walk_grid_tiles(const ForwardParams& p,
                                                StageBarriers<kStages>* bars, int lane,
                                                RunTile&& run_tile) {
  const dim3 tiles(p.tile_grid[0], p.tile_grid[1], p.tile_grid[2]);
  const unsigned num_grid_tiles = tiles.x * tiles.y * tiles.z;
  unsigned t = blockIdx.x;
  for (int k = 1; t < num_grid_tiles; ++k) {  // k: the ordinal of the next tile
    run_tile(tile_index(t, tiles), tiles);
    if (p.tile_counter == nullptr) {
      t += gridDim.x;
      continue;
    }
    const int slot = k % 2;
    if (kCopyRole && threadIdx.x == kMathThreads) {
      const unsigned next = gridDim.x + atomicAdd(p.tile_counter, 1u);
      if (k >= 3) barrier_wait(&bars->tile_empty[slot], ((k - 3) / 2) & 1);
      bars->tile[slot] = next;
      barrier_arrive(&bars->tile_full[slot]);
    }
    // Lane 0 of each warp reads the slot, frees it and hands the tile to its warp.
    unsigned next = 0;
    if (lane == 0) {
      barrier_wait(&bars->tile_full[slot], ((k - 1) / 2) & 1);
      next = *static_cast<volatile unsigned*>(&bars->tile[slot]);
      barrier_arrive(&bars->tile_empty[slot]);
    }
    t = __shfl_sync(0xffffffffu, next, 0);
  }
}

}  // namespace fmha::cuda::sm90
