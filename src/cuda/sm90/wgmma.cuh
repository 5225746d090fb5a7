// Warpgroup-level primitives of the Hopper generation (sm_90a), written over PTX: the swizzled
// shared-memory tile layouts that wgmma reads, their matrix descriptors, and the fence / commit /
// wait protocol of the asynchronous products (the products themselves: wgmma_ops.cuh).
//
// Layout. A [kRows, kCols] tile of 16-bit elements is stored as column blocks of kSwizzleBytes-wide
// rows (64 elements for 128-byte swizzling, 32 for 64-byte), block after block; inside a block,
// row r holds its 16-byte chunks permuted by XOR with the row's swizzle phase, which is what the
// tensor cores undo when they read (PTX ISA, "Shared Memory Matrix Layout", canonical layouts
// Swizzle<3,4,3> / Swizzle<2,4,3>). Every block starts at a multiple of its swizzle period
// (1024 / 512 bytes) from a 1024-byte aligned base, so the phase is a function of r alone.
//   K-major operand (rows = M or N, columns = K: Q, K): 8-row groups kSwizzleBytes * 8 apart (SBO);
//     a k16 step moves the start address by 32 bytes inside the block, or to the next block.
//   MN-major operand (rows = K, columns = N: V in P V): 8-row groups kSwizzleBytes * 8 apart
//     (SBO) and column blocks kRows * kSwizzleBytes apart (LBO); a k16 step moves by 16 rows.
#pragma once

#include <cstdint>

namespace fmha::cuda::sm90 {

template <int kRows, int kCols>
struct SwizzledTile {
  static_assert(kRows % 8 == 0 && kCols % 32 == 0, "whole 8-row groups and 32-column blocks");
  static constexpr int kSwizzleBytes = kCols % 64 == 0 ? 128 : 64;
  static constexpr int kBlockCols = kSwizzleBytes / 2;
  static constexpr int kChunksPerRow = kSwizzleBytes / 16;
  static constexpr int kBlockBytes = kRows * kSwizzleBytes;
  static constexpr int kBytes = kBlockBytes * (kCols / kBlockCols);
  // Descriptor layout-type field: 1 = 128-byte swizzle, 2 = 64-byte swizzle.
  static constexpr std::uint64_t kLayoutType = kSwizzleBytes == 128 ? 1 : 2;

  // Byte offset of the 16-byte chunk holding columns 8c..8c+7 of row r.
  __device__ __forceinline__ static std::uint32_t chunk_offset(int r, int c) {
    const int block = c / kChunksPerRow;
    const int chunk = c % kChunksPerRow;
    const int phase = kSwizzleBytes == 128 ? (r & 7) : ((r >> 1) & 3);
    return static_cast<std::uint32_t>(block * kBlockBytes + r * kSwizzleBytes +
                                      ((chunk ^ phase) << 4));
  }

  __device__ __forceinline__ static std::uint64_t descriptor(std::uint32_t address,
                                                             std::uint32_t leading,
                                                             std::uint32_t stride) {
    return static_cast<std::uint64_t>((address & 0x3FFFF) >> 4) |
           (static_cast<std::uint64_t>(leading >> 4) << 16) |
           (static_cast<std::uint64_t>(stride >> 4) << 32) | (kLayoutType << 62);
  }

  // K-major operand: rows [first_row, first_row + 64 or N) of the tile at `base`, k16 step kk.
  __device__ __forceinline__ static std::uint64_t k_major(std::uint32_t base, int first_row,
                                                          int kk) {
    const int col = kk * 16;
    const std::uint32_t address = base + (col / kBlockCols) * kBlockBytes +
                                  first_row * kSwizzleBytes + (col % kBlockCols) * 2;
    return descriptor(address, 16, 8 * kSwizzleBytes);  // leading offset unused when swizzled
  }

  // The k16 step kk of a K-major operand as an offset of the descriptor of step 0 (the start
  // address field counts 16-byte units; addresses stay below 2^18, so it never carries out):
  // k_major(base, row, kk) == k_major(base, row, 0) + k_step(kk). A compile-time constant, so
  // that a long run of steps costs one live descriptor, not one per step.
  static constexpr std::uint64_t k_step(int kk) {
    return static_cast<std::uint64_t>(
        ((kk * 16) / kBlockCols * kBlockBytes + (kk * 16) % kBlockCols * 2) >> 4);
  }

  // MN-major operand: the whole tile, rows 0..15 as the first k16 step.
  __device__ __forceinline__ static std::uint64_t mn_major(std::uint32_t base) {
    return descriptor(base, kBlockBytes, 8 * kSwizzleBytes);
  }
  // Step kk (rows 16kk..16kk+15) as an offset of mn_major's descriptor (the start address field
  // counts 16-byte units and never carries out): a compile-time constant, as k_step.
  static constexpr std::uint64_t mn_step(int kk) {
    return static_cast<std::uint64_t>((kk * 16 * kSwizzleBytes) >> 4);
  }
};

// Orders this thread's earlier register and shared-memory accesses before the warpgroup's next
// wgmma (required before the first wgmma that reads registers written since the last one).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed wgmma groups of the warpgroup are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins accumulator registers in place around the asynchronous products, so the compiler neither
// reads them before wgmma_wait nor moves their last writes past the product that consumes them.
template <int kTiles>
__device__ __forceinline__ void fence_accumulators(float (&d)[kTiles][4]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[t][e])::"memory");
  }
}
template <int kTiles>
__device__ __forceinline__ void zero_accumulators(float (&d)[kTiles][4]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) d[t][e] = 0.0f;
  }
}
// The same for A fragments held in registers: their packing stays before wgmma_fence.
template <int kSteps>
__device__ __forceinline__ void fence_fragments(std::uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[kk][e])::"memory");
  }
}

// Makes shared memory written through the generic proxy (cp.async, st.shared) visible to the
// async proxy that wgmma reads through; each writing thread runs it before the barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Named barriers (ids 1..15; id 0 is __syncthreads): bar.sync waits until kCount threads of the
// block have arrived at barrier kId since it last completed, counting itself; bar.arrive counts
// itself and goes on. Unlike __syncthreads, the arriving threads may sit at different program
// points, which is what lets two warpgroups meet while doing different work. kCount is a multiple
// of the warp size, and every warp arrives with all its threads.
template <int kId, int kCount>
__device__ __forceinline__ void named_barrier_sync() {
  static_assert(kId > 0 && kId < 16 && kCount % 32 == 0, "named barrier id 1..15, whole warps");
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kCount) : "memory");
}
template <int kId, int kCount>
__device__ __forceinline__ void named_barrier_arrive() {
  static_assert(kId > 0 && kId < 16 && kCount % 32 == 0, "named barrier id 1..15, whole warps");
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kCount) : "memory");
}

// The kernels' named barriers, one id each whatever kernel uses it (a barrier id that one part of
// a kernel joins with 256 threads and another with 128 is an illegal instruction): the rendezvous
// of all threads once per tile (the mainloops without a copy warpgroup), the leader's turn handed
// to the follower and back (the latter with a copy warpgroup only), and each warpgroup's own
// barrier (the fused backward's dQ sum tile, fused_dq.cuh: kWarpgroupBarrier + warpgroup).
inline constexpr int kPipelineBarrier = 1;
inline constexpr int kTurnBarrier = 2;
inline constexpr int kTurnBackBarrier = 3;
inline constexpr int kWarpgroupBarrier = 4;  // and 5
inline constexpr int kCopyBarrier = 6;       // the forward's copy warpgroup (token tiles)

// The turns of two warpgroups in ping-pong in a mainloop without a copy warpgroup (the backward
// kernels; the protocol and its deadlock freedom: mainloop_bwd_dq.cuh's loop comment). Warpgroup 0
// leads, warpgroup 1 (`follower`) trails it half a tile; `rendezvous(u)` is the loop's rendezvous
// of all threads for tile u. Without ping-pong (kEnabled false, follower false) each step is the
// leader's: rendezvous u before the products, nothing else.
template <bool kEnabled, int kThreads>
struct PingPongTurns {
  bool follower;
  // Before the loop: the follower's rendezvous 0.
  template <typename Rendezvous>
  __device__ __forceinline__ void start(Rendezvous& rendezvous, int tiles) const {
    if (follower && tiles > 0) rendezvous(0);
  }
  // Before tile u's first products: the leader's rendezvous u, or the follower's turn (the leader
  // issued them).
  template <typename Rendezvous>
  __device__ __forceinline__ void before_products(Rendezvous& rendezvous, int u) const {
    if (follower) {
      named_barrier_sync<kTurnBarrier, kThreads>();
    } else {
      rendezvous(u);
    }
  }
  // Once they are issued: the leader hands the turn to the follower.
  __device__ __forceinline__ void after_issue() const {
    if (kEnabled && !follower) named_barrier_arrive<kTurnBarrier, kThreads>();
  }
  // Once they have landed: the follower's rendezvous u + 1, before its softmax of tile u.
  template <typename Rendezvous>
  __device__ __forceinline__ void after_wait(Rendezvous& rendezvous, int u, int tiles) const {
    if (follower && u + 1 < tiles) rendezvous(u + 1);
  }
};

}  // namespace fmha::cuda::sm90
