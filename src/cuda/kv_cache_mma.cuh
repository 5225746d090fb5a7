// The tensor-core kernel of attention over a KV cache (SPEC §16), the default on sm80 and newer
// (kv_cache.cu), beside the CUDA-core kernel of kv_cache_kernels.cuh, whose row layout, split
// ranges, workspace and combine it shares.
//
// Decode reads the cache once and does little arithmetic per byte, so the kernel is built to keep
// HBM busy: a block (4 warps) owns kRowTiles tiles of kRows (query, head-of-group) rows of one kv
// head and one split of the keys, and streams that split's keys through shared memory in tiles of
// kTileKeys keys with 16-byte cp.async copies in a ring of 2-6 stages (mma_stages: the most that
// keep two blocks an SM). Every K/V element a block loads serves all of its rows:
// a GQA group of up to 64 heads at Lq = 1 (32 at D 256; MQA 32/1 included), or a group times a few
// query tokens, reads the cache once. Each key row's address comes from the block table (page = key / page_size,
// the page index clamped into the pool); keys past the split and columns past D / Dv are
// zero-filled, so NaN or garbage in unused cache rows never reaches the products.
//
// Warps: warp w takes row tile w / kKeyGroups and the key slice w % kKeyGroups of every stage
// (kKeyGroups = 4 / kRowTiles slices of kWarpKeys keys), with its own fp32 online softmax over
// them: S = Q K^T and O += P V on mma.sync m16n8k16 (Q fragments loaded once with ldmatrix, K with
// ldmatrix, V with ldmatrix.trans, P kept in registers as the A operand). At the end the warps of a
// row tile merge their (O, max, sum) through shared memory (over the ring) and write the split's
// partial (or out and lse with one split).
//
// Head dims: D and Dv are padded to multiples of 16 with zero columns; the template bucket (64,
// 128, 256) bounds them so every register array has a compile-time size. At bucket 256 the Q
// fragments are re-read from shared memory per k-step instead of held (they would not fit beside
// O), and a block takes at most two row tiles.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/online_softmax.cuh"
#include "cuda/common/tile_primitives.cuh"
#include "cuda/kv_cache_kernels.cuh"

namespace fmha::cuda::kv_cache {

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMinStages = 2;
constexpr int kMaxStages = 6;
// Shared memory a block may take and still share an sm90 SM with a second one (228 KB per SM, 1 KB
// reserved per block); callers that know the device pass its own figure (mma_pair_limit).
constexpr int kMmaSharedTarget = 113 * 1024;

__host__ __device__ constexpr int mma_pair_limit(int shared_per_sm, int reserved_per_block) {
  return shared_per_sm / 2 - reserved_per_block;
}

static_assert(kRows == 16, "a row tile is one m16 tile");

// Keys per pipeline stage at a head-dim bucket: 35-37 KB of K and V a stage at D 64 / 128, 34 KB at
// D 256 (32 keys: with 64, 68 KB a stage, D 256 fitted one block an SM; bench/cpp's
// kv_cache_decode_timing.cu times that form with tile_keys=64).
__host__ __device__ constexpr int mma_tile_keys(int bucket) {
  return bucket <= 64 ? 128 : (bucket <= 128 ? 64 : 32);
}
static_assert(mma_tile_keys(64) <= kMmaThreads, "one thread looks up one key's cache row");

// Row tiles a block takes: the fewest of 1, 2, 4 that cover the `row_tiles` tiles of one (sequence,
// kv head), at most 4 (2 at bucket 256, whose O already takes 128 registers a thread), and at least
// enough that each warp's slice of a stage is a whole 16-key k-step (2 at bucket 256's 32 keys: the
// four warps split into two row tiles of two 16-key slices, the second tile idle at Lq x group <= 16).
__host__ __device__ constexpr int mma_row_tiles(int row_tiles, int bucket) {
  const int most = bucket <= 128 ? 4 : 2;
  int tiles = kMmaWarps * 16 / mma_tile_keys(bucket) > 1 ? kMmaWarps * 16 / mma_tile_keys(bucket) : 1;
  while (tiles < row_tiles && tiles < most) tiles *= 2;
  return tiles;
}
static_assert(mma_row_tiles(1, 256) == 2 && mma_row_tiles(1, 128) == 1 && mma_row_tiles(3, 64) == 4,
              "row tiles: the fewest covering the rows that give each warp whole k-steps");

__host__ __device__ constexpr int round_up16(int x) {
  return (x + 15) / 16 * 16;
}

// The template bucket of a problem: D and Dv padded to 16 must both fit it.
__host__ __device__ constexpr int mma_bucket(int head_dim, int value_dim) {
  const int padded =
      round_up16(head_dim) > round_up16(value_dim) ? round_up16(head_dim) : round_up16(value_dim);
  return padded <= 64 ? 64 : (padded <= 128 ? 128 : 256);
}

// Byte layout of the dynamic shared memory. K / V rows and the Q tile have a pitch of the padded
// dim + 8 elements: an odd number of 16-byte units, so the 8 rows of one ldmatrix matrix fall in 8
// different bank groups. The warps' fp32 O tiles of the final merge overlay the ring (pitch Dv
// padded + 8 floats: 8 or 24 words mod 32, so a half-warp's float2 stores hit 32 distinct banks).
struct MmaLayout {
  int tile_keys;                  // keys a stage
  int k_pitch, v_pitch, o_pitch;  // elements (K, V, Q), floats (merged O)
  int stage, v_in_stage;          // bytes: one stage, V's offset within it
  int ring, q, offsets, stats, total;
};

// `tile_keys` 0: the bucket's mma_tile_keys.
__host__ __device__ constexpr MmaLayout mma_layout(int head_dim, int value_dim, int stages,
                                                   int row_tiles = 1, int tile_keys = 0) {
  MmaLayout s{};
  s.tile_keys = tile_keys > 0 ? tile_keys : mma_tile_keys(mma_bucket(head_dim, value_dim));
  s.k_pitch = round_up16(head_dim) + 8;
  s.v_pitch = round_up16(value_dim) + 8;
  s.o_pitch = round_up16(value_dim) + 8;
  s.v_in_stage = s.tile_keys * s.k_pitch * 2;
  s.stage = s.v_in_stage + s.tile_keys * s.v_pitch * 2;
  const int merge = kMmaWarps * kRows * s.o_pitch * 4;
  s.ring = stages * s.stage > merge ? stages * s.stage : merge;
  s.q = s.ring;
  s.offsets = s.q + (row_tiles * kRows * s.k_pitch * 2 + 15) / 16 * 16;
  s.stats = s.offsets + 2 * s.tile_keys * 2 * 8;  // two slots of (K, V) row addresses per key
  // A warp's max and sum per row of its tile, then the block's per row (at most 4 tiles).
  s.total = s.stats + 4 * kMmaWarps * kRows * 4;
  return s;
}

// The stage count the kernel runs with on a device whose blocks may take `max_shared` bytes and
// whose SM holds two blocks of up to `pair_limit` bytes each (sm90: (228 KB - 2 x 1 KB) / 2): the
// most that keep two blocks an SM, else the most one block may take, up to kMaxStages; 0 when not
// even kMinStages fit (the problem runs the CUDA-core kernel). Two blocks first, whatever the
// stages: on an H100 (bf16 decode, 2026-11-28, bench/cpp/kv_cache_decode_timing.cu) one block an
// SM with 4-6 stages read 1.2-1.5 TB/s where two blocks read 2.0-2.6, at D 64 (two stages of 128
// keys: 2.0-2.6 TB/s, 13-23% above four stages of 64 keys) and at D 128 (three stages: 2.6 TB/s).
// D 256 in 64-key stages (68 KB) fitted one block only; in 32-key stages two blocks with two stages
// read 2.33-2.59 TB/s, 17-22% above one block with three stages of 64 keys.
__host__ __device__ constexpr int mma_stages(int head_dim, int value_dim, int max_shared,
                                             int row_tiles = 1, int tile_keys = 0,
                                             int pair_limit = kMmaSharedTarget) {
  int two = 0, one = 0;
  for (int stages = kMinStages; stages <= kMaxStages; ++stages) {
    const int bytes = mma_layout(head_dim, value_dim, stages, row_tiles, tile_keys).total;
    if (bytes > max_shared) break;
    if (bytes <= pair_limit) two = stages;
    one = stages;
  }
  return two > 0 ? two : one;
}

static_assert(mma_stages(128, 128, 227 * 1024) == 3, "D 128: three stages, two blocks per sm90 SM");
static_assert(mma_stages(64, 64, 227 * 1024) == 2, "D 64: two stages of 128 keys, two blocks");
static_assert(mma_stages(128, 128, 227 * 1024, 2) == 2, "D 128, two row tiles: two stages, two blocks");
static_assert(mma_stages(256, 256, 227 * 1024, 2) == 2, "D 256: two stages, two blocks per sm90 SM");
static_assert(mma_stages(256, 256, 163 * 1024, 2, 0, 163 * 1024 / 2) == 4,
              "D 256 on sm80: one block an SM, four stages");
static_assert(mma_layout(kMaxHeadDim, kMaxHeadDim, kMinStages).ring >=
                  kMmaWarps * kRows * (kMaxHeadDim + 8) * 4,
              "the merge of the warps' O tiles fits over the ring");

// The cache rows of the keys of one (sequence, kv head): K's and V's first element of a key. The
// parts that do not depend on the key (the sequence's table row, the head's offset) are worked
// out once, not per key; past the split's keys (key >= end) the caches' bases, which the copies
// never read (they zero-fill rows from the tile's live count on).
template <typename T>
struct KeyRows {
  const T* k_cache;
  const T* v_cache;
  const T* k_head;  // kv head's element 0 of page 0 (paged) or of the sequence (contiguous)
  const T* v_head;
  const std::int32_t* table;  // the sequence's block-table row; null: contiguous

  __device__ __forceinline__ KeyRows(const KvCacheKernelParams& p, int b, int kv_head)
      : k_cache(static_cast<const T*>(p.k.data)), v_cache(static_cast<const T*>(p.v.data)),
        table(p.block_table != nullptr ? p.block_table + b * p.table_batch : nullptr) {
    const std::int64_t page = p.block_table != nullptr ? 0 : b;
    k_head = k_cache + page * p.k.page + kv_head * p.k.head;
    v_head = v_cache + page * p.v.page + kv_head * p.v.head;
  }

  __device__ __forceinline__ void find(const KvCacheKernelParams& p, std::int64_t key,
                                       std::int64_t end, const T** k_row, const T** v_row) const {
    if (key >= end) {
      *k_row = k_cache;
      *v_row = v_cache;
      return;
    }
    std::int64_t page = 0, row = key;
    if (table != nullptr) {
      // key < cache_seqlens (int32, clamped to >= 0): the 32-bit division is exact.
      const auto entry = static_cast<std::uint32_t>(key) / static_cast<std::uint32_t>(p.page_size);
      page = clamp64(table[static_cast<std::int64_t>(entry) * p.table_page], 0, p.num_pages - 1);
      row = key - static_cast<std::int64_t>(entry) * p.page_size;
    }
    *k_row = k_head + (page * p.k.page + row * p.k.row);
    *v_row = v_head + (page * p.v.page + row * p.v.row);
  }
};

// Copies the rows of one tile (each key's K and V row in `rows`, [kTileKeys][2]; the first `live`
// keys are the split's, the rest zero-filled) into a stage: K [kTileKeys][k_pitch], then V
// [kTileKeys][v_pitch]. 16-byte cp.async where every row allows (p.vector_loads), zero-filled past
// the keys and the dims; otherwise element loads stored directly (unaligned rows, D or Dv not a
// multiple of 8: correct, not fast).
template <typename T, int kTileKeys, int kBucket>
__device__ __forceinline__ void copy_tile(const KvCacheKernelParams& p, const T* const* rows,
                                          int live, unsigned char* stage, const MmaLayout& layout,
                                          int tid) {
  T* k_tile = reinterpret_cast<T*>(stage);
  T* v_tile = reinterpret_cast<T*>(stage + layout.v_in_stage);
  const int D = p.head_dim, Dv = p.value_dim;
  const int k_cols = round_up16(D), v_cols = round_up16(Dv);
  if (p.vector_loads && k_cols == kBucket && v_cols == kBucket) {
    // Rows as wide as the bucket (D and Dv pad to it): the chunk pattern is known at compile time.
    // Thread tid copies chunk tid % kChunks of rows tid / kChunks + kRowsPerPass i, K and V, so
    // the loop has no divisions and the stage offsets are immediates. A copy costs its row's
    // address (one 16-byte shared load for K's and V's), a 64-bit add and a compare with the live
    // rows: the form that read element offsets, tested each for -1 and selected a source took
    // about 230 instructions of a warp's tile at D 128 (the SASS of bf16, 64-key tiles).
    constexpr int kChunks = kBucket / 8, kRowsPerPass = kMmaThreads / kChunks, kPitch = kBucket + 8;
    static_assert(kMmaThreads % kChunks == 0 && kTileKeys % kRowsPerPass == 0, "whole passes of rows");
    const int chunk = tid % kChunks, row0 = tid / kChunks;
    // This thread's rows of the tile come from the cache while i * kRowsPerPass is below its live
    // count (none for a column past D / Dv); the rest are zero-filled.
    const int k_rows = chunk * 8 < D ? live - row0 : 0, v_rows = chunk * 8 < Dv ? live - row0 : 0;
    const std::uint32_t k_base = tile::shared_address(k_tile + row0 * kPitch + chunk * 8);
    const std::uint32_t v_base = tile::shared_address(v_tile + row0 * kPitch + chunk * 8);
#pragma unroll
    for (int i = 0; i < kTileKeys / kRowsPerPass; ++i) {
      const int j = row0 + i * kRowsPerPass;
      const uint4 pair = *reinterpret_cast<const uint4*>(rows + j * 2);  // K and V row addresses
      const T* k_row = reinterpret_cast<const T*>((static_cast<std::uint64_t>(pair.y) << 32) | pair.x);
      const T* v_row = reinterpret_cast<const T*>((static_cast<std::uint64_t>(pair.w) << 32) | pair.z);
      tile::cp_async_16_whole_lines(k_base + i * kRowsPerPass * kPitch * 2, k_row + chunk * 8,
                                    i * kRowsPerPass < k_rows ? 16 : 0);
      tile::cp_async_16_whole_lines(v_base + i * kRowsPerPass * kPitch * 2, v_row + chunk * 8,
                                    i * kRowsPerPass < v_rows ? 16 : 0);
    }
    return;
  }
  if (p.vector_loads) {
    // Thread tid copies chunks tid, tid + kMmaThreads, ... of the tile (row-major in chunks of 8
    // elements): consecutive lanes take consecutive 16 bytes of a row.
#pragma unroll 1
    for (int part = 0; part < 2; ++part) {
      T* tile = part == 0 ? k_tile : v_tile;
      const int dim = part == 0 ? D : Dv, chunks = (part == 0 ? k_cols : v_cols) / 8;
      const int pitch = part == 0 ? layout.k_pitch : layout.v_pitch;
      const int step_rows = kMmaThreads / chunks, step_chunks = kMmaThreads % chunks;
      int j = tid / chunks, chunk = tid % chunks;
#pragma unroll 4
      while (j < kTileKeys) {
        const bool copied = j < live && chunk * 8 < dim;
        tile::cp_async_16(tile::shared_address(tile + j * pitch + chunk * 8),
                          rows[j * 2 + part] + chunk * 8, copied ? 16 : 0);
        j += step_rows;
        chunk += step_chunks;
        if (chunk >= chunks) {
          chunk -= chunks;
          ++j;
        }
      }
    }
    return;
  }
#pragma unroll 1
  for (int e = tid; e < kTileKeys * k_cols; e += kMmaThreads) {
    const int j = e / k_cols, d = e - j * k_cols;
    k_tile[j * layout.k_pitch + d] = j < live && d < D ? rows[j * 2][d] : from_float<T>(0.0f);
  }
#pragma unroll 1
  for (int e = tid; e < kTileKeys * v_cols; e += kMmaThreads) {
    const int j = e / v_cols, d = e - j * v_cols;
    v_tile[j * layout.v_pitch + d] = j < live && d < Dv ? rows[j * 2 + 1][d] : from_float<T>(0.0f);
  }
}

// cp.async.wait_group takes an immediate: the runtime stage count picks one. Tile t must have
// landed while the later stages - 2 stay in flight.
__device__ __forceinline__ void cp_async_wait_stages(int stages) {
  switch (stages) {
    case 2: tile::cp_async_wait<0>(); break;
    case 3: tile::cp_async_wait<1>(); break;
    case 4: tile::cp_async_wait<2>(); break;
    case 5: tile::cp_async_wait<3>(); break;
    default: tile::cp_async_wait<4>(); break;
  }
}
static_assert(kMaxStages == 6, "cp_async_wait_stages covers 2..6 stages");

// grid (batch x kv_heads x ceil(row_tiles / kRowTiles), num_splits); kMmaThreads threads; dynamic
// shared memory mma_layout(D, Dv, stages, kRowTiles, kTileKeys).total.
template <typename T, int kBucket, int kRowTiles, int kTileKeys>
__global__ void __launch_bounds__(kMmaThreads, 1)
    kv_cache_mma_kernel(const __grid_constant__ KvCacheKernelParams p, int stages) {
  using Ops = tile::Dtype<T>;
  constexpr int kKeyGroups = kMmaWarps / kRowTiles;  // warps sharing a row tile
  constexpr int kWarpKeys = kTileKeys / kKeyGroups;   // a warp's keys of a stage
  constexpr int kKeySteps = kWarpKeys / 16;           // its k-steps of P V
  constexpr int kScoreTiles = kWarpKeys / 8;          // its n-tiles of S
  constexpr int kBlockRows = kRowTiles * kRows;
  constexpr int kSteps = kBucket / 16;    // k-steps of Q K^T, at most
  constexpr int kOutTiles = kBucket / 8;  // n-tiles of O, at most
  constexpr bool kQInRegisters = kBucket <= 128;
  constexpr int kQSteps = kQInRegisters ? kSteps : 1;
  static_assert(kMmaWarps % kRowTiles == 0 && kWarpKeys % 16 == 0, "whole k-steps a warp");
  static_assert(kTileKeys <= kMmaThreads, "one thread looks up one key's cache row");
  extern __shared__ __align__(16) unsigned char shared[];

  const int D = p.head_dim, Dv = p.value_dim;
  const MmaLayout layout = mma_layout(D, Dv, stages, kRowTiles, kTileKeys);
  const int d_steps = round_up16(D) / 16, v_pairs = round_up16(Dv) / 16;
  // Whether D and Dv fill the bucket: the products' k-steps and output tiles then go untested.
  const bool full_dims = d_steps == kSteps && v_pairs == kOutTiles / 2;
  auto by_dims = [full_dims](auto&& products) {
    if (full_dims) {
      products(std::true_type{});
    } else {
      products(std::false_type{});
    }
  };
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, c = lane % 4;  // fragment row and column pair
  const int row_tile = warp / kKeyGroups, key_group = warp % kKeyGroups;
  const int blocks_per_head = (p.row_tiles + kRowTiles - 1) / kRowTiles;
  const int block_tile = blockIdx.x % blocks_per_head;
  const int kv_head = (blockIdx.x / blocks_per_head) % p.kv_heads;
  const int b = blockIdx.x / blocks_per_head / p.kv_heads;
  const int split = blockIdx.y;

  std::int64_t q_first = 0, q_count = 0;
  query_run(p, b, &q_first, &q_count);
  const std::int64_t first_row = static_cast<std::int64_t>(block_tile) * kBlockRows;
  const std::int64_t valid_rows = q_count * p.group;
  if (first_row >= valid_rows) return;  // the whole block is past this sequence's queries
  const std::int64_t keys = clamp64(p.cache_seqlens[b * p.seqlens_stride], 0, p.capacity);

  // Q tile [kBlockRows][k_pitch]: zero past the queries and past D (the padded k-steps add
  // nothing). With 16-byte rows, by cp.async in a commit group of its own ahead of the prologue's
  // tiles (waited for before the fragments are read, below): thread tid copies 16-byte chunks tid,
  // tid + kMmaThreads, ... of the tile, a row's (token, head) worked out once a chunk. The element
  // loop is the fallback: its per-element 64-bit divisions by the group took most of a small
  // decode's time (H200, 2026-11-28, MQA 32/1 D 128 B 1 L 4k: 40 us a kernel, Nsight Compute's top
  // stall the integer chain).
  T* q_tile = reinterpret_cast<T*>(shared + layout.q);
  {
    const T* q = static_cast<const T*>(p.q);
    const int cols = round_up16(D);
    if (p.q_vector_loads) {
      const int chunks = cols / 8;
      for (int e = tid; e < kBlockRows * chunks; e += kMmaThreads) {
        const int r = e / chunks, chunk = e - r * chunks;
        const std::int64_t row = first_row + r;
        const bool live = row < valid_rows && chunk * 8 < D;
        const T* src = live ? q + query_row_offset(p, b, kv_head, q_first, row) + chunk * 8 : q;
        tile::cp_async_16(tile::shared_address(q_tile + r * layout.k_pitch + chunk * 8), src,
                          live ? 16 : 0);
      }
    } else {
      for (int e = tid; e < kBlockRows * cols; e += kMmaThreads) {
        const int r = e / cols, d = e - r * cols;
        const std::int64_t row = first_row + r;
        q_tile[r * layout.k_pitch + d] = row < valid_rows && d < D
                                             ? q[query_row_offset(p, b, kv_head, q_first, row) + d]
                                             : from_float<T>(0.0f);
      }
    }
    tile::cp_async_commit();  // an empty group without vector loads
  }

  // The keys any row of the block sees, then this split's part (whole kTileKeys tiles), as the
  // CUDA-core kernel does with its own tile size.
  const std::int64_t last_row =
      (valid_rows < first_row + kBlockRows ? valid_rows : first_row + kBlockRows) - 1;
  const std::int64_t lowest = keys - q_count + first_row / p.group;  // position of the first row
  const std::int64_t highest = keys - q_count + last_row / p.group;  // and of the last
  std::int64_t begin = p.has_lower ? clamp64(lowest - p.lower, 0, keys) : 0;
  std::int64_t end = p.has_upper ? clamp64(highest + p.upper + 1, 0, keys) : keys;
  if (end < begin) end = begin;
  const std::int64_t chunk =
      ((end - begin + p.num_splits - 1) / p.num_splits + kTileKeys - 1) / kTileKeys * kTileKeys;
  begin = begin + split * chunk < end ? begin + split * chunk : end;
  end = begin + chunk < end ? begin + chunk : end;
  const int tiles = static_cast<int>((end - begin + kTileKeys - 1) / kTileKeys);

  // This warp's row tile: its first row, and this lane's rows g and g + 8 (valid, and their
  // positions for the masks; the range its rows see, to skip the masks where none applies).
  const std::int64_t tile_row = first_row + row_tile * kRows;
  bool row_valid[2];
  std::int64_t position[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const std::int64_t row = tile_row + g + 8 * h;
    row_valid[h] = row < valid_rows;
    position[h] = keys - q_count + row / p.group;
  }
  const bool tile_live = tile_row < valid_rows;  // warp-uniform
  const std::int64_t tile_last = (valid_rows < tile_row + kRows ? valid_rows : tile_row + kRows) - 1;
  const std::int64_t tile_lowest = keys - q_count + tile_row / p.group;
  const std::int64_t tile_highest = keys - q_count + tile_last / p.group;

  auto* row_table = reinterpret_cast<const T**>(shared + layout.offsets);  // [2][kTileKeys][2]
  unsigned char* ring = shared;
  const KeyRows<T> key_rows(p, b, kv_head);
  const T* next_k = nullptr;  // this thread's key's rows of a tile not yet issued
  const T* next_v = nullptr;
  auto look_up = [&](int u) {
    if (tid < kTileKeys) {
      key_rows.find(p, begin + static_cast<std::int64_t>(u) * kTileKeys + tid, end, &next_k,
                    &next_v);
    }
  };
  auto publish = [&](int u) {  // into slot u % 2; read by copy_tile(u) after the next barrier
    if (tid < kTileKeys) {
      row_table[(u % 2) * kTileKeys * 2 + tid * 2] = next_k;
      row_table[(u % 2) * kTileKeys * 2 + tid * 2 + 1] = next_v;
    }
  };
  // The stage slots of the next tile to issue and of the tile to read, counted along (a runtime
  // modulo by the stage count was an integer division a tile).
  int issue_slot = 0, read_slot = 0;
  auto next_slot = [stages](int slot) { return slot + 1 == stages ? 0 : slot + 1; };
  auto issue =
      [&](int u) {  // tile u into stage u % stages, one commit group (empty past the tiles)
        if (u < tiles) {
          const std::int64_t left = end - begin - static_cast<std::int64_t>(u) * kTileKeys;
          copy_tile<T, kTileKeys, kBucket>(p, row_table + (u % 2) * kTileKeys * 2,
                                           static_cast<int>(left < kTileKeys ? left : kTileKeys),
                                           ring + issue_slot * layout.stage, layout, tid);
        }
        issue_slot = next_slot(issue_slot);
        tile::cp_async_commit();
      };

  // Prologue: tiles 0 .. stages - 2 in flight, the offsets of tile stages - 1 published.
  look_up(0);
  publish(0);
  for (int s = 0; s < stages - 1; ++s) {
    __syncthreads();
    issue(s);
    look_up(s + 1);
    publish(s + 1);
  }

  // Q's group has landed once at most the prologue's stages - 1 tiles are in flight
  // (cp_async_wait_stages(n) leaves n - 2 groups pending); the barrier publishes every thread's.
  cp_async_wait_stages(stages + 1);
  __syncthreads();

  // Per-lane A fragments of Q (rows r + 8 (i % 2), columns 8 (i / 2) of each k-step; i = lane / 8).
  const int mi = lane / 8, mr = lane % 8;
  const std::uint32_t q_address = tile::shared_address(
      q_tile + (row_tile * kRows + mr + (mi % 2) * 8) * layout.k_pitch + (mi / 2) * 8);
  std::uint32_t q_frag[kQSteps][4];
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      if (ks < d_steps) tile::ldmatrix_x4(q_frag[ks], q_address + ks * 32);
    }
  }
  // ldmatrix row addresses within a stage: K rows are keys (matrices: keys +8 (i / 2), columns +8
  // (i % 2)); V rows are keys too, read transposed (keys +8 (i % 2), columns +8 (i / 2)).
  const int k_lane = (key_group * kWarpKeys + mr + (mi / 2) * 8) * layout.k_pitch + (mi % 2) * 8;
  const int v_lane = (key_group * kWarpKeys + mr + (mi % 2) * 8) * layout.v_pitch + (mi / 2) * 8;

  float o[kOutTiles][4];
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  OnlineSoftmax softmax;  // rows g and g + 8: max in log2 units, this lane's part of the sum
  softmax.init();
  const float scale_log2 = p.scale * kLog2e;

#pragma unroll 1
  for (int t = 0; t < tiles; ++t) {
    cp_async_wait_stages(stages);  // this thread's copies of tile t have landed
    __syncthreads();               // everyone's; stage (t - 1) % stages is free again
    look_up(t + stages);
    issue(t + stages - 1);
    const std::int64_t key0 =
        begin + static_cast<std::int64_t>(t) * kTileKeys + key_group * kWarpKeys;
    // Warp-uniform: a row tile past the queries, or a key slice past the split's end (zero rows),
    // has nothing to add.
    if (tile_live && key0 < end) {
      unsigned char* stage = ring + read_slot * layout.stage;
      const std::uint32_t k_address = tile::shared_address(reinterpret_cast<T*>(stage) + k_lane);
      const std::uint32_t v_address =
          tile::shared_address(reinterpret_cast<T*>(stage + layout.v_in_stage) + v_lane);

      // S = Q K^T over the warp's keys: s[n] holds keys 8n .. 8n + 7 of its slice.
      float s[kScoreTiles][4];
#pragma unroll
      for (int n = 0; n < kScoreTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      auto score_products = [&](auto full) {
#pragma unroll
        for (int ks = 0; ks < kSteps; ++ks) {
          if (decltype(full)::value || ks < d_steps) {
            if constexpr (!kQInRegisters) tile::ldmatrix_x4(q_frag[0], q_address + ks * 32);
            const std::uint32_t(&a)[4] = q_frag[kQInRegisters ? ks : 0];
#pragma unroll
            for (int j = 0; j < kKeySteps; ++j) {
              std::uint32_t k_frag[4];
              tile::ldmatrix_x4(k_frag, k_address + j * 16 * layout.k_pitch * 2 + ks * 32);
              tile::mma_m16n8k16<T>(s[2 * j], a, k_frag[0], k_frag[1]);
              tile::mma_m16n8k16<T>(s[2 * j + 1], a, k_frag[2], k_frag[3]);
            }
          }
        }
      };
      by_dims(score_products);

      // Scores in log2 units; the masks only where the slice is not visible to every row. Each
      // test is warp-uniform and taken once for the tile, not per score.
      const bool whole = key0 + kWarpKeys <= end &&
                         (!p.has_upper || key0 + kWarpKeys - 1 <= tile_lowest + p.upper) &&
                         (!p.has_lower || key0 >= tile_highest - p.lower);
      if (p.softcap > 0.0f) {
#pragma unroll
        for (int n = 0; n < kScoreTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[n][e] = p.softcap * tanh_approx(s[n][e] * p.scale / p.softcap) * kLog2e;
          }
        }
      } else {
#pragma unroll
        for (int n = 0; n < kScoreTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] *= scale_log2;
        }
      }
      if (!whole) {
#pragma unroll
        for (int n = 0; n < kScoreTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = e / 2;
            const std::int64_t key = key0 + 8 * n + 2 * c + (e % 2);
            bool visible = key < end && row_valid[h];
            if (p.has_upper) visible = visible && key <= position[h] + p.upper;
            if (p.has_lower) visible = visible && key >= position[h] - p.lower;
            if (!visible) s[n][e] = -INFINITY;
          }
        }
      }

      // Online softmax of rows g (elements 0, 1) and g + 8 (elements 2, 3); O rescaled with it.
      softmax.update</*kLazyRescale=*/true, /*kFlushDenormals=*/true>(s, o);

      // O += P V, one k-step (16 keys) at a time: P's C fragments of two n-tiles are the A
      // fragment of a k-step.
      auto value_products = [&](auto full) {
#pragma unroll
        for (int j = 0; j < kKeySteps; ++j) {
          const std::uint32_t p_frag[4] = {
              Ops::pack(s[2 * j][0], s[2 * j][1]), Ops::pack(s[2 * j][2], s[2 * j][3]),
              Ops::pack(s[2 * j + 1][0], s[2 * j + 1][1]),
              Ops::pack(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
          for (int n = 0; n < kOutTiles / 2; ++n) {
            if (decltype(full)::value || n < v_pairs) {
              std::uint32_t v_frag[4];
              tile::ldmatrix_x4_trans(v_frag, v_address + j * 16 * layout.v_pitch * 2 + n * 32);
              tile::mma_m16n8k16<T>(o[2 * n], p_frag, v_frag[0], v_frag[1]);
              tile::mma_m16n8k16<T>(o[2 * n + 1], p_frag, v_frag[2], v_frag[3]);
            }
          }
        }
      };
      by_dims(value_products);
    }
    publish(t + stages);
    read_slot = next_slot(read_slot);
  }

  // Merge the warps of each row tile: each scales its O by 2^(its max - the tile's max) into fp32
  // tiles over the ring; row max and sum of the block go to shared memory.
  tile::cp_async_wait_all();
  float* warp_max = reinterpret_cast<float*>(shared + layout.stats);  // [kMmaWarps][kRows]
  float* warp_sum = warp_max + kMmaWarps * kRows;                     // [kMmaWarps][kRows]
  float* block_max = warp_sum + kMmaWarps * kRows;                    // [kBlockRows]
  float* block_sum = block_max + kMmaWarps * kRows;                   // [kBlockRows]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_sum(softmax.row_sum[h]);
    if (c == 0) {
      warp_max[warp * kRows + g + 8 * h] = softmax.row_max[h];
      warp_sum[warp * kRows + g + 8 * h] = sum;
    }
  }
  __syncthreads();  // the ring is free: every warp has finished its last tile
  float* merged = reinterpret_cast<float*>(shared);  // [kMmaWarps][kRows][o_pitch]
  const int first_warp = row_tile * kKeyGroups;     // of this warp's row tile
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kKeyGroups; ++w) {
      top = fmaxf(top, warp_max[(first_warp + w) * kRows + g + 8 * h]);
    }
    const float max2 = softmax.row_max[h];
    const float weight = max2 == -INFINITY ? 0.0f : exp2f(max2 - top);
    float* out_row = merged + (warp * kRows + g + 8 * h) * layout.o_pitch + 2 * c;
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) {
      if (n < 2 * v_pairs) {
        *reinterpret_cast<float2*>(out_row + 8 * n) =
            make_float2(o[n][2 * h] * weight, o[n][2 * h + 1] * weight);
      }
    }
  }
  if (tid < kBlockRows) {
    const int warp0 = (tid / kRows) * kKeyGroups, r = tid % kRows;
    float top = -INFINITY;
    for (int w = 0; w < kKeyGroups; ++w) top = fmaxf(top, warp_max[(warp0 + w) * kRows + r]);
    float sum = 0.0f;
    for (int w = 0; w < kKeyGroups; ++w) {
      const float m = warp_max[(warp0 + w) * kRows + r];
      if (m != -INFINITY) sum += warp_sum[(warp0 + w) * kRows + r] * exp2f(m - top);
    }
    block_max[tid] = top;
    block_sum[tid] = sum;
  }
  __syncthreads();

  // Epilogue, as the CUDA-core kernel's: one split writes out and lse (with the sink), several
  // write normalised partials and their lse (log2 units).
  const int out_b = p.cu_seqlens_q == nullptr ? b : 0;
  for (int e = tid; e < kBlockRows * Dv; e += kMmaThreads) {
    const int r = e / Dv, d = e - r * Dv;
    const std::int64_t row = first_row + r;
    if (row >= valid_rows) break;  // rows ascend with e
    const std::int64_t i = row / p.group;
    const int h = kv_head * p.group + static_cast<int>(row % p.group);
    const int warp0 = (r / kRows) * kKeyGroups, tr = r % kRows;
    float value = 0.0f;
#pragma unroll
    for (int w = 0; w < kKeyGroups; ++w) {
      value += merged[((warp0 + w) * kRows + tr) * layout.o_pitch + d];
    }
    const float max2 = block_max[r], sum = block_sum[r];
    if (p.num_splits > 1) {
      const std::int64_t part_row = static_cast<std::int64_t>(split) * p.total_q * p.heads +
                                    query_token(p, b, q_first, i) * p.heads + h;
      p.partial_out[part_row * Dv + d] = sum > 0.0f ? value / sum : 0.0f;
      if (d == 0) p.partial_lse[part_row] = sum > 0.0f ? max2 + log2f(sum) : -INFINITY;
      continue;
    }
    const RowFinish finish = finish_row(p, h, max2, sum);
    const std::int64_t token = p.cu_seqlens_q == nullptr ? i : q_first + i;
    static_cast<T*>(p.out)[row_offset(p.out_rows, out_b, token, h) + d] =
        from_float<T>(value * finish.weight);
    if (d == 0 && p.lse != nullptr) {
      p.lse[row_offset(p.lse_rows, out_b, token, h)] = finish.lse;
    }
  }
}

}  // namespace fmha::cuda::kv_cache
