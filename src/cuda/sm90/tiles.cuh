// Tile building blocks shared by the sm90 kernels: asynchronous copies of 16-bit tiles into the
// swizzled layouts of wgmma.cuh, and the shared-memory x shared-memory products over a head dim.
#pragma once

#include <cstdint>

#include "cuda/common/tile_primitives.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/sm90/wgmma_ops.cuh"

namespace fmha::cuda::sm90 {

// Copies a [kRows, kD] tile of 16-bit elements into the swizzled layout at shared address `dst`:
// tile row r is row `row` of `gmem` (rows `row_stride` apart) where source_row(r, &row) is true,
// zeros where it is false, and columns >= cols are zero-filled (no garbage, maybe NaN, may meet a
// zero probability or a zero q column in a product). load_tile_async takes consecutive rows,
// load_rows_async rows gathered by token.
// `thread` is the calling thread's index among the kThreads that copy.
template <int kRows, int kD, int kThreads, typename SourceRow>
__device__ __forceinline__ void load_mapped_rows_async(std::uint32_t dst, const std::uint16_t* gmem,
                                                       std::int64_t row_stride,
                                                       const SourceRow& source_row, int cols,
                                                       bool vector_loads, int thread) {
  using Tile = SwizzledTile<kRows, kD>;
  constexpr int kChunks = kD / 8;               // 16-byte chunks per row
  constexpr int kRowStep = kThreads / kChunks;  // rows between a thread's chunks, when whole
  if constexpr (kThreads % kChunks == 0 && kRowStep % 8 == 0 && kRows % kRowStep == 0) {
    if (vector_loads) {
      // Each thread copies one column chunk of rows r0, r0 + kRowStep, ...: a whole number of
      // 8-row swizzle periods apart, so every destination is one offset plus a multiple of the
      // period (few registers, no per-chunk swizzle arithmetic).
      const int c = thread % kChunks;
      const int r0 = thread / kChunks;
      const std::uint32_t first = dst + Tile::chunk_offset(r0, c);
#pragma unroll
      for (int it = 0; it < kRows / kRowStep; ++it) {
        int row;
        const bool inside = source_row(r0 + it * kRowStep, &row) && c * 8 < cols;
        const std::uint16_t* src = inside ? gmem + row * row_stride + c * 8 : gmem;
        tile::cp_async_16(first + it * kRowStep * Tile::kSwizzleBytes, src, inside ? 16 : 0);
      }
      return;
    }
  }
  if (vector_loads) {
#pragma unroll
    for (int it = 0; it < (kRows * kChunks + kThreads - 1) / kThreads; ++it) {
      const int index = it * kThreads + thread;
      if ((kRows * kChunks) % kThreads != 0 && index >= kRows * kChunks) break;
      const int r = index / kChunks;
      const int c = index % kChunks;
      int row;
      const bool inside = source_row(r, &row) && c * 8 < cols;
      const std::uint16_t* src = inside ? gmem + row * row_stride + c * 8 : gmem;
      tile::cp_async_16(dst + Tile::chunk_offset(r, c), src, inside ? 16 : 0);
    }
  } else {
    // Unaligned rows or head dims: element loads (ordered by the pipeline's barriers).
    for (int index = thread; index < kRows * kD; index += kThreads) {
      const int r = index / kD;
      const int c = index % kD;
      int row;
      const bool inside = source_row(r, &row) && c < cols;
      const std::uint16_t x = inside ? gmem[row * row_stride + c] : 0;
      const std::uint32_t at = dst + Tile::chunk_offset(r, c / 8) + (c % 8) * 2;
      asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(at), "h"(x) : "memory");
    }
  }
}

// Rows 0 .. valid_rows - 1 of `gmem`, zeros below.
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_tile_async(std::uint32_t dst, const std::uint16_t* gmem,
                                                std::int64_t row_stride, int valid_rows, int cols,
                                                bool vector_loads,
                                                int thread = static_cast<int>(threadIdx.x)) {
  load_mapped_rows_async<kRows, kD, kThreads>(
      dst, gmem, row_stride,
      [valid_rows](int r, int* row) {
        *row = r;
        return r < valid_rows;
      },
      cols, vector_loads, thread);
}

// Row r is token tokens[r] of `gmem` (a shared-memory array; -1: past the grid or a hole, zeros).
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_rows_async(std::uint32_t dst, const std::uint16_t* gmem,
                                                std::int64_t row_stride, const int* tokens,
                                                int cols, bool vector_loads,
                                                int thread = static_cast<int>(threadIdx.x)) {
  load_mapped_rows_async<kRows, kD, kThreads>(
      dst, gmem, row_stride,
      [tokens](int r, int* row) {
        *row = tokens[r];
        return *row >= 0;
      },
      cols, vector_loads, thread);
}

// Keys first_key .. first_key + valid - 1 of one batch's paged KV cache (ForwardParams::
// block_table; `table` is the batch's row of it): row r is row (page * page_size + key %
// page_size) of `gmem`, the cache's page 0, with the page index clamped to [0, num_pages) (bad
// device tables give wrong numbers, never a read outside the pool); zeros past `valid`. Keys, pool
// rows, the row stride and table offsets are 32-bit (kv_cache_forward_applies keeps them below
// 2^31).
// Pages of a power-of-two size (page_shift >= 0), where each thread copies one column chunk of
// every kRowStep-th row (the range loaders' layout), take a short path: the table entries of a
// batch of the thread's rows read first, all in flight at once, then their copies, in 32-bit
// arithmetic. The general path (any page size, a division a row, 64-bit offsets, a table read
// before each copy) ran the copy warpgroup at about 1,700 instructions a K / V tile pair where the
// range loaders take 400 (Nsight Compute): the math warps waited for the stages, at a quarter of
// the dense forward's speed (D 128, pages of 16 or 64).
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_paged_rows_async(
    std::uint32_t dst, const std::uint16_t* gmem, std::int64_t row_stride, const std::int32_t* table,
    std::int64_t table_page_stride, std::int64_t first_key, int valid, int page_size,
    int page_shift, std::int64_t num_pages, int cols, bool vector_loads,
    int thread = static_cast<int>(threadIdx.x)) {
  using Tile = SwizzledTile<kRows, kD>;
  constexpr int kChunks = kD / 8;               // 16-byte chunks per row
  constexpr int kRowStep = kThreads / kChunks;  // rows between a thread's chunks, when whole
  const int last_page = static_cast<int>(num_pages - 1);
  const int table_stride = static_cast<int>(table_page_stride);
  if constexpr (kThreads % kChunks == 0 && kRows % kRowStep == 0) {
    if (vector_loads && page_shift >= 0) {
      constexpr int kIters = kRows / kRowStep;  // rows a thread copies
      // Rows whose table reads are in flight at once: the largest divisor of kIters up to 8.
      constexpr int kBatch = kIters % 8 == 0   ? 8
                             : kIters % 5 == 0 ? 5
                             : kIters % 4 == 0 ? 4
                             : kIters % 3 == 0 ? 3
                             : kIters % 2 == 0 ? 2
                                               : 1;
      const int c = thread % kChunks;
      const int r0 = thread / kChunks;
      // Offsets in unsigned 32-bit products widened to 64 bits (one IMAD.WIDE.U32 each). (A
      // select of a safe address for the copies of nothing, below, spilled more registers.)
      const char* const column = reinterpret_cast<const char*>(gmem + c * 8);
      const std::uint32_t row_bytes = static_cast<std::uint32_t>(row_stride) * 2u;
      const std::uint32_t entry_stride = static_cast<std::uint32_t>(table_stride);
      // Row r0 + it * kRowStep exists (and the chunk holds columns) when it * kRowStep < rows.
      const int rows = c * 8 < cols ? valid - r0 : 0;
      const int key0 = static_cast<int>(first_key) + r0;
      const int in_page = page_size - 1;
#pragma unroll
      for (int b = 0; b < kIters; b += kBatch) {
        int page[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int key = key0 + (b + i) * kRowStep;
          const std::uint32_t slot = static_cast<std::uint32_t>(key) >> page_shift;
          page[i] = (b + i) * kRowStep < rows ? table[slot * entry_stride] : 0;
        }
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int key = key0 + (b + i) * kRowStep;
          const int pg = min(max(page[i], 0), last_page);
          // Inside the pool whatever the table holds. A row past `valid`, or a chunk past the head
          // dim, copies nothing (source size 0: no byte read).
          const auto row = static_cast<std::uint32_t>((pg << page_shift) | (key & in_page));
          const auto* src =
              reinterpret_cast<const std::uint16_t*>(column + std::uint64_t{row} * row_bytes);
          // Rows a whole swizzle period apart share one offset pattern; else each its own.
          const int r = r0 + (b + i) * kRowStep;
          const std::uint32_t to =
              dst + (kRowStep % 8 == 0 ? Tile::chunk_offset(r0, c) + (r - r0) * Tile::kSwizzleBytes
                                       : Tile::chunk_offset(r, c));
          tile::cp_async_16(to, src, (b + i) * kRowStep < rows ? 16 : 0);
        }
      }
      return;
    }
  }
  load_mapped_rows_async<kRows, kD, kThreads>(
      dst, gmem, row_stride,
      [=](int r, int* row) {
        if (r >= valid) return false;
        const int key = static_cast<int>(first_key) + r;
        const int slot = page_shift >= 0 ? key >> page_shift : key / page_size;
        int page = table[slot * table_stride];
        page = page < 0 ? 0 : (page > last_page ? last_page : page);
        *row = page * page_size + (key - slot * page_size);
        return true;
      },
      cols, vector_loads, thread);
}

// Tiles that follow each other in global memory (tile u: rows [u * kRows, u * kRows + kRows) of
// a range, or any tile at an element offset from the range's first row), copied with 16-byte
// cp.async in the layout of load_tile_async, for a loop that copies
// one tile per iteration: each thread's source pointer, row step and destination offset are set
// up once, so a tile costs its copies plus a few additions instead of the 64-bit row arithmetic
// of load_mapped_rows_async (about 100 instructions a warp per K or V tile at D 64, profiled).
// Usable where each thread copies one column chunk of rows a whole swizzle period apart, or half
// of one (a row step of 4, above D 128: its destinations alternate between two offsets) (kUsable),
// and rows are 16-byte aligned (vector_loads); callers fall back to load_tile_async otherwise.
template <int kRows, int kD, int kThreads>
struct RangeTileLoader {
  using Tile = SwizzledTile<kRows, kD>;
  static constexpr int kChunks = kD / 8;
  static constexpr int kRowStep = kThreads / kChunks;
  // Destination offsets a thread alternates between: 1, or 2 for a row step of 4.
  static constexpr int kOffsets = kRowStep % 8 == 0 ? 1 : 2;
  static constexpr bool kUsable = kThreads % kChunks == 0 &&
                                  (kRowStep % 8 == 0 || kRowStep == 4) &&
                                  kRows % (kRowStep * kOffsets) == 0;

  const std::uint16_t* base;   // row 0 of the range (the address of zero-filled copies)
  const std::uint16_t* first;  // this thread's chunk of its first row of tile 0
  std::int64_t row_step;       // elements between this thread's rows
  std::int64_t tile_step;      // elements between tiles
  std::uint32_t smem_offset[kOffsets];  // this thread's first chunks in a tile's layout
  int first_row;               // this thread's first row of a tile
  bool column_inside;          // this thread's chunk holds columns < cols

  // `thread`: the calling thread's index among the kThreads that copy.
  __device__ __forceinline__ RangeTileLoader(const std::uint16_t* gmem, std::int64_t row_stride,
                                             int cols, int thread = static_cast<int>(threadIdx.x)) {
    const int c = thread % kChunks;
    first_row = thread / kChunks;
    base = gmem;
    first = gmem + first_row * row_stride + c * 8;
    row_step = kRowStep * row_stride;
    tile_step = kRows * row_stride;
#pragma unroll
    for (int i = 0; i < kOffsets; ++i) {
      smem_offset[i] = Tile::chunk_offset(first_row + i * kRowStep, c);
    }
    column_inside = c * 8 < cols;
  }

  // Tile u into the layout at shared address dst: its rows < valid_rows, zeros below.
  __device__ __forceinline__ void load(std::uint32_t dst, int u, int valid_rows) const {
    load_at(dst, u * tile_step, valid_rows);
  }

  // The same for the tile whose first row starts `offset` elements past the range's first row
  // (another head's rows, say: offsets need not be whole tiles).
  __device__ __forceinline__ void load_at(std::uint32_t dst, std::int64_t offset,
                                          int valid_rows) const {
    static_assert(kUsable, "one column chunk of whole or half swizzle periods per thread");
    const std::uint16_t* src = first + offset;
#pragma unroll
    for (int it = 0; it < kRows / kRowStep; ++it) {
      const bool inside = column_inside && first_row + it * kRowStep < valid_rows;
      // Rows kRowStep * kOffsets apart share a swizzle phase.
      tile::cp_async_16(dst + smem_offset[it % kOffsets] +
                            (it / kOffsets) * kRowStep * kOffsets * Tile::kSwizzleBytes,
                        inside ? src : base, inside ? 16 : 0);
      src += row_step;
    }
  }
};

// Copies `count` fp32 values (a row statistic of a query tile) to shared address `dst` with
// 4-byte asynchronous copies, zero-filling entries >= valid. Threads [first_thread, +count) work.
__device__ __forceinline__ void load_floats_async(std::uint32_t dst, const float* src, int count,
                                                  int valid, int first_thread) {
  const int i = static_cast<int>(threadIdx.x) - first_thread;
  if (i >= 0 && i < count) {
    const bool inside = i < valid;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4 * i),
                 "l"(inside ? src + i : src), "r"(inside ? 4 : 0));
  }
}

// Gathered by token: entry i is src[tokens[i]] (4-byte asynchronous copies), or `fill` where the
// token is -1 (a plain store, published by the same barrier as the copies).
__device__ __forceinline__ void load_floats_by_token_async(std::uint32_t dst, const float* src,
                                                           const int* tokens, int count, float fill,
                                                           int first_thread) {
  const int i = static_cast<int>(threadIdx.x) - first_thread;
  if (i >= 0 && i < count) {
    const int token = tokens[i];
    if (token >= 0) {
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst + 4 * i),
                   "l"(src + token));
    } else {
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(dst + 4 * i), "f"(fill) : "memory");
    }
  }
}

// The rendezvous of all threads in a cp.async mainloop (the forward, dQ and dK/dV loops without a
// copy warpgroup): each thread waits until at most kPending of its commit groups are in flight
// and fences what landed for the async proxy (the tensor cores read it); the barrier then makes
// every thread's copies visible to all and frees the stage that the next loads overwrite;
// `issue_loads` issues those (maybe none) as one more commit group, so that every rendezvous
// commits exactly one.
template <int kPending, int kThreads, typename IssueLoads>
__device__ __forceinline__ void rendezvous_then_load(const IssueLoads& issue_loads) {
  tile::cp_async_wait<kPending>();
  fence_proxy_async();
  named_barrier_sync<kPipelineBarrier, kThreads>();
  issue_loads();
  tile::cp_async_commit();
}

// Zeros kBytes of shared memory from `dst` (16-byte stores by all kThreads threads); the tensor
// cores see them after each writer's fence_proxy_async and a barrier.
template <int kBytes, int kThreads>
__device__ __forceinline__ void zero_shared(std::uint32_t dst) {
  static_assert(kBytes % 16 == 0, "whole 16-byte chunks");
  for (int i = static_cast<int>(threadIdx.x); i < kBytes / 16; i += kThreads) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst + 16 * i), "r"(0)
                 : "memory");
  }
}

// acc = A B^T over kSteps k16 steps, both operands K-major in shared memory: A's rows
// [a_first_row, +64) (the warpgroup's), B's rows [b_first_row, + 8 * kTiles) (N = 8 * kTiles; a
// multiple of 8, the swizzle's row group). Steps past the head dim would hold zero columns only;
// callers pick kSteps before the run (a branch inside a run of wgmma makes ptxas end the group
// and inject warpgroup.arrive, warning C7519).
template <typename T, int kSteps, typename ATile, typename BTile, int kTiles>
__device__ __forceinline__ void ss_product(float (&acc)[kTiles][4], std::uint32_t smem_a,
                                           int a_first_row, std::uint32_t smem_b,
                                           int b_first_row = 0) {
  const std::uint64_t a = ATile::k_major(smem_a, a_first_row, 0);
  const std::uint64_t b = BTile::k_major(smem_b, b_first_row, 0);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    Wgmma<T, kTiles * 8>::template ss<0>(acc, a + ATile::k_step(kk), b + BTile::k_step(kk), kk > 0);
  }
}

// acc += A B over kSteps k16 steps: A from registers (fragments of 16 k-columns each), B in
// shared memory MN-major (rows = k). N = 8 * kTiles.
template <typename T, int kSteps, typename BTile, int kTiles>
__device__ __forceinline__ void rs_product(float (&acc)[kTiles][4],
                                           const std::uint32_t (&a)[kSteps][4],
                                           std::uint32_t smem_b) {
  const std::uint64_t b = BTile::mn_major(smem_b);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    Wgmma<T, kTiles * 8>::template rs<1>(acc, a[kk], b + BTile::mn_step(kk), 1);
  }
}

// acc = A B over kSteps k16 steps, both operands MN-major in shared memory (rows = k, from row
// first_k of each tile): A = ATile's columns [a_first_col, +64) (a whole swizzle block: the M of
// the product is 64), B = all of BTile's columns (N = 8 * kTiles).
// (`accumulate`: acc += A B instead.)
template <typename T, int kSteps, typename ATile, typename BTile, int kTiles>
__device__ __forceinline__ void mn_product(float (&acc)[kTiles][4], std::uint32_t smem_a,
                                           int a_first_col, std::uint32_t smem_b, int first_k,
                                           bool accumulate = false) {
  static_assert(ATile::kBlockCols == 64, "A's 64 columns are one 128-byte swizzle block");
  const std::uint64_t a = ATile::mn_major(smem_a + a_first_col / 64 * ATile::kBlockBytes +
                                          first_k * ATile::kSwizzleBytes);
  const std::uint64_t b = BTile::mn_major(smem_b + first_k * BTile::kSwizzleBytes);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    Wgmma<T, kTiles * 8>::template ss<1, 1>(acc, a + ATile::mn_step(kk), b + BTile::mn_step(kk),
                                            kk > 0 || accumulate);
  }
}

// acc = A B over kSteps k16 steps, A MN-major (rows = k, from row first_k; columns [a_first_col,
// +64), a whole 128-byte swizzle block: the M of the product) and B K-major (rows = N, all of
// BTile's, N = 8 * kTiles; columns = k from first_k).
template <typename T, int kSteps, typename ATile, typename BTile, int kTiles>
__device__ __forceinline__ void mk_product(float (&acc)[kTiles][4], std::uint32_t smem_a,
                                           int a_first_col, std::uint32_t smem_b, int first_k) {
  static_assert(ATile::kBlockCols == 64, "A's 64 columns are one 128-byte swizzle block");
  const std::uint64_t a = ATile::mn_major(smem_a + a_first_col / 64 * ATile::kBlockBytes +
                                          first_k * ATile::kSwizzleBytes);
  const std::uint64_t b = BTile::k_major(smem_b, 0, 0);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    Wgmma<T, kTiles * 8>::template ss<0, 1>(acc, a + ATile::mn_step(kk),
                                            b + BTile::k_step(first_k / 16 + kk), kk > 0);
  }
}

// Packs fp32 accumulator tiles (m16n8 C layout) into the A fragments of the next product: the
// accumulators of columns 16kk..16kk+15 are exactly A fragment kk.
template <typename T, int kTiles>
__device__ __forceinline__ void pack_fragments(const float (&c)[kTiles][4],
                                               std::uint32_t (&a)[kTiles / 2][4]) {
  using Convert = tile::Dtype<T>;
#pragma unroll
  for (int kk = 0; kk < kTiles / 2; ++kk) {
    a[kk][0] = Convert::pack(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = Convert::pack(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = Convert::pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = Convert::pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

// Stores one warp's A fragments (rows [first_row, first_row + 16) of a 16-bit product operand, 16
// columns a fragment) into the swizzled `Tile` at `smem` with stmatrix: lane l addresses row l % 8
// of 8 x 8 matrix l / 8, the matrices in fragment order (rows 0-7 / 8-15, then columns 8-15).
// `first_chunk`: the fragments' first 16-byte chunk of the row (their first column / 8).
template <typename Tile, int kSteps>
__device__ __forceinline__ void store_fragments_stmatrix(std::uint32_t smem, int first_row,
                                                         const std::uint32_t (&a)[kSteps][4],
                                                         int lane, int first_chunk = 0) {
  const int matrix = lane / 8;
  const int row = first_row + lane % 8 + 8 * (matrix & 1);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const std::uint32_t at = smem + Tile::chunk_offset(row, first_chunk + 2 * kk + (matrix >> 1));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(at),
                 "r"(a[kk][0]), "r"(a[kk][1]), "r"(a[kk][2]), "r"(a[kk][3])
                 : "memory");
  }
}

// Stores 16 staged rows of a swizzled tile (rows [first_row, first_row + 16) of `tile` in shared
// memory at `smem`) to global rows `row_stride` apart, rows < valid_rows and columns < cols only;
// 16-byte stores when the destination allows them. One warp; `lane` its lane.
// Only the 16-byte chunks [kFirstChunk, kFirstChunk + kChunks) of each row (a column chunk).
// With `tokens` (token tiles: a shared-memory array of the 16 rows' tokens), row r goes to global
// row tokens[r] instead, and rows whose token is -1 are not stored.
template <int kD, int kFirstChunk = 0, int kChunks = kD / 8, typename Tile>
__device__ __forceinline__ void store_tile_rows(const std::uint8_t* smem, Tile, int first_row,
                                                int valid_rows, std::uint16_t* gmem,
                                                std::int64_t row_stride, int cols, int lane,
                                                const int* tokens = nullptr) {
  const bool vector =
      cols % 8 == 0 && row_stride % 8 == 0 && reinterpret_cast<std::uintptr_t>(gmem) % 16 == 0;
  for (int index = lane; index < 16 * kChunks; index += 32) {
    const int r = index / kChunks;
    const int c = kFirstChunk + index % kChunks;
    if (r >= valid_rows || c * 8 >= cols) continue;
    const std::int64_t row = tokens != nullptr ? tokens[r] : r;
    if (row < 0) continue;
    const std::uint8_t* staged = smem + Tile::chunk_offset(first_row + r, c);
    std::uint16_t* dst = gmem + row * row_stride + c * 8;
    if (vector) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(staged);
    } else {
      const auto* x = reinterpret_cast<const std::uint16_t*>(staged);
      for (int e = 0; e < 8 && c * 8 + e < cols; ++e) dst[e] = x[e];
    }
  }
}

}  // namespace fmha::cuda::sm90
