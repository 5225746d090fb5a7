// The tensor-core kernel of attention over a KV cache (SPEC §16), the second version beside the
// CUDA-core kernel of kv_cache_kernels.cuh, whose row layout, split ranges, workspace and combine
// it shares. Selected with FMHA_KV_CACHE_KERNEL=mma (kv_cache.cu); the CUDA-core kernel stays the
// default until this one has passed tests/cuda/test_cuda_kv_cache.cpp on a GPU: it has been
// compiled for sm_80 and sm_90a, not yet run.
//
// Decode reads the cache once and does little arithmetic per byte, so the kernel is built to keep
// HBM busy: a block (4 warps) owns one tile of kRows (query, head-of-group) rows of one kv head and
// one split of the keys, and streams that split's keys through shared memory in tiles of kTileKeys
// keys with 16-byte cp.async copies in a ring of 2-4 stages (the launcher picks the most that keep
// two blocks on an sm90 SM; tens of KB in flight per block). Each key row's address comes from the
// block table (page = key / page_size, the page index clamped into the pool); keys past the split
// and columns past D / Dv are zero-filled, so NaN or garbage in unused cache rows never reaches the
// products. Within a block the warps split the keys again: warp w takes keys 16w .. 16w + 15 of
// every tile and runs its own online softmax (fp32) over them, S = Q K^T and O += P V on mma.sync
// m16n8k16 (Q fragments loaded once with ldmatrix, K with ldmatrix, V with ldmatrix.trans, P kept
// in registers as the A operand). At the end the four warps' (O, max, sum) are merged through
// shared memory (over the ring) and written as the split's partial (or as out and lse with one
// split).
//
// Head dims: D and Dv are padded to multiples of 16 with zero columns; the template bucket (64,
// 128, 256) bounds them so every register array has a compile-time size. At bucket 256 the Q
// fragments are re-read from shared memory per k-step instead of held (they would not fit beside
// O).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/tile_primitives.cuh"
#include "cuda/kv_cache_kernels.cuh"

namespace fmha::cuda::kv_cache {

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kTileKeys = 64;                     // keys per pipeline stage
constexpr int kWarpKeys = kTileKeys / kMmaWarps;  // one k-step of P V per warp and stage
constexpr int kMinStages = 2;
constexpr int kMaxStages = 4;
// Shared memory a block may take and still share an sm90 SM with a second one (228 KB per SM, 1 KB
// reserved per block): the stage count is the largest that fits it (fewer stages, two blocks,
// rather than four stages and one: the same bytes in flight, twice the warps to hide latency).
constexpr int kMmaSharedTarget = 113 * 1024;

static_assert(kRows == 16, "one m16 tile of rows per block");
static_assert(kWarpKeys == 16, "a warp's keys of a stage are one k-step (16) of P V");
static_assert(kTileKeys <= kMmaThreads, "one thread looks up one key's cache row");

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
  int k_pitch, v_pitch, o_pitch;  // elements (K, V, Q), floats (merged O)
  int stage, v_in_stage;          // bytes: one stage, V's offset within it
  int ring, q, offsets, stats, total;
};

__host__ __device__ constexpr MmaLayout mma_layout(int head_dim, int value_dim, int stages) {
  MmaLayout s{};
  s.k_pitch = round_up16(head_dim) + 8;
  s.v_pitch = round_up16(value_dim) + 8;
  s.o_pitch = round_up16(value_dim) + 8;
  s.v_in_stage = kTileKeys * s.k_pitch * 2;
  s.stage = s.v_in_stage + kTileKeys * s.v_pitch * 2;
  const int merge = kMmaWarps * kRows * s.o_pitch * 4;
  s.ring = stages * s.stage > merge ? stages * s.stage : merge;
  s.q = s.ring;
  s.offsets = s.q + (kRows * s.k_pitch * 2 + 15) / 16 * 16;
  s.stats = s.offsets + 2 * kTileKeys * 2 * 8;  // two slots of (K, V) int64 offsets per key
  s.total = s.stats + (2 * kMmaWarps * kRows + 2 * kRows) * 4;
  return s;
}

// The stages the kernel runs with on a device whose blocks may take `max_shared` bytes: the most in
// [kMinStages, kMaxStages] within kMmaSharedTarget, else kMinStages if that fits, else 0 (the
// problem does not fit: the CUDA-core kernel serves it).
__host__ __device__ constexpr int mma_stages(int head_dim, int value_dim, int max_shared) {
  for (int stages = kMaxStages; stages >= kMinStages; --stages) {
    const int bytes = mma_layout(head_dim, value_dim, stages).total;
    if (bytes <= kMmaSharedTarget && bytes <= max_shared) return stages;
  }
  return mma_layout(head_dim, value_dim, kMinStages).total <= max_shared ? kMinStages : 0;
}

static_assert(mma_stages(128, 128, 227 * 1024) == 3, "D 128: three stages, two blocks per sm90 SM");
static_assert(mma_stages(64, 64, 227 * 1024) == 4, "D 64: four stages");
static_assert(mma_stages(256, 256, 163 * 1024) == 2, "D 256 fits an sm80 block with two stages");
static_assert(mma_layout(kMaxHeadDim, kMaxHeadDim, kMinStages).ring >=
                  kMmaWarps * kRows * (kMaxHeadDim + 8) * 4,
              "the merge of the warps' O tiles fits over the ring");

// Cache-row offsets (elements) of one key of K and of V; -1 past the split's keys.
__device__ __forceinline__ void key_row_offsets(const KvCacheKernelParams& p, int b, int kv_head,
                                                std::int64_t key, std::int64_t end,
                                                std::int64_t* k_offset, std::int64_t* v_offset) {
  if (key >= end) {
    *k_offset = -1;
    *v_offset = -1;
    return;
  }
  std::int64_t page = b, row = key;
  if (p.block_table != nullptr) {
    // key < cache_seqlens (int32, clamped to >= 0): the 32-bit division is exact.
    const auto entry = static_cast<std::uint32_t>(key) / static_cast<std::uint32_t>(p.page_size);
    page =
        clamp64(p.block_table[b * p.table_batch + static_cast<std::int64_t>(entry) * p.table_page],
                0, p.num_pages - 1);
    row = key - static_cast<std::int64_t>(entry) * p.page_size;
  }
  *k_offset = page * p.k.page + row * p.k.row + kv_head * p.k.head;
  *v_offset = page * p.v.page + row * p.v.row + kv_head * p.v.head;
}

// Copies the rows of one tile (cache element offsets in `offsets`, [kTileKeys][2]) into a stage:
// K [kTileKeys][k_pitch], then V [kTileKeys][v_pitch]. 16-byte cp.async where every row allows
// (p.vector_loads), zero-filled past the keys and the dims; otherwise element loads stored directly
// (unaligned rows, D or Dv not a multiple of 8: correct, not fast).
template <typename T>
__device__ __forceinline__ void copy_tile(const KvCacheKernelParams& p, const std::int64_t* offsets,
                                          unsigned char* stage, const MmaLayout& layout, int tid) {
  const T* k_cache = static_cast<const T*>(p.k.data);
  const T* v_cache = static_cast<const T*>(p.v.data);
  T* k_tile = reinterpret_cast<T*>(stage);
  T* v_tile = reinterpret_cast<T*>(stage + layout.v_in_stage);
  const int D = p.head_dim, Dv = p.value_dim;
  const int k_cols = round_up16(D), v_cols = round_up16(Dv);
  if (p.vector_loads) {
    // Thread tid copies chunks tid, tid + kMmaThreads, ... of the tile (row-major in chunks of 8
    // elements): consecutive lanes take consecutive 16 bytes of a row.
#pragma unroll 1
    for (int part = 0; part < 2; ++part) {
      const T* cache = part == 0 ? k_cache : v_cache;
      T* tile = part == 0 ? k_tile : v_tile;
      const int dim = part == 0 ? D : Dv, chunks = (part == 0 ? k_cols : v_cols) / 8;
      const int pitch = part == 0 ? layout.k_pitch : layout.v_pitch;
      const int step_rows = kMmaThreads / chunks, step_chunks = kMmaThreads % chunks;
      int j = tid / chunks, chunk = tid % chunks;
#pragma unroll 4
      while (j < kTileKeys) {
        const std::int64_t offset = offsets[j * 2 + part];
        const bool live = offset >= 0 && chunk * 8 < dim;
        tile::cp_async_16(tile::shared_address(tile + j * pitch + chunk * 8),
                          live ? cache + offset + chunk * 8 : cache, live ? 16 : 0);
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
    const std::int64_t offset = offsets[j * 2];
    k_tile[j * layout.k_pitch + d] =
        offset >= 0 && d < D ? k_cache[offset + d] : from_float<T>(0.0f);
  }
#pragma unroll 1
  for (int e = tid; e < kTileKeys * v_cols; e += kMmaThreads) {
    const int j = e / v_cols, d = e - j * v_cols;
    const std::int64_t offset = offsets[j * 2 + 1];
    v_tile[j * layout.v_pitch + d] =
        offset >= 0 && d < Dv ? v_cache[offset + d] : from_float<T>(0.0f);
  }
}

// cp.async.wait_group takes an immediate: the runtime stage count picks one.
__device__ __forceinline__ void cp_async_wait_stages(int stages) {
  if (stages >= 4) {
    tile::cp_async_wait<2>();
  } else if (stages == 3) {
    tile::cp_async_wait<1>();
  } else {
    tile::cp_async_wait<0>();
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <typename T, int kBucket>
__global__ void __launch_bounds__(kMmaThreads)
    kv_cache_mma_kernel(const __grid_constant__ KvCacheKernelParams p, int stages) {
  using Ops = tile::Dtype<T>;
  constexpr int kSteps = kBucket / 16;    // k-steps of Q K^T, at most
  constexpr int kOutTiles = kBucket / 8;  // n-tiles of O, at most
  constexpr bool kQInRegisters = kBucket <= 128;
  constexpr int kQSteps = kQInRegisters ? kSteps : 1;
  extern __shared__ __align__(16) unsigned char shared[];

  const int D = p.head_dim, Dv = p.value_dim;
  const MmaLayout layout = mma_layout(D, Dv, stages);
  const int d_steps = round_up16(D) / 16, v_pairs = round_up16(Dv) / 16;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, c = lane % 4;  // fragment row and column pair
  const int tile = blockIdx.x % p.row_tiles;
  const int kv_head = (blockIdx.x / p.row_tiles) % p.kv_heads;
  const int b = blockIdx.x / p.row_tiles / p.kv_heads;
  const int split = blockIdx.y;

  std::int64_t q_first = 0, q_count = 0;
  query_run(p, b, &q_first, &q_count);
  const std::int64_t first_row = static_cast<std::int64_t>(tile) * kRows;
  const std::int64_t valid_rows = q_count * p.group;
  if (first_row >= valid_rows) return;  // the whole tile is past this sequence's queries
  const std::int64_t keys = clamp64(p.cache_seqlens[b * p.seqlens_stride], 0, p.capacity);

  // Q tile [kRows][k_pitch]: zero past the queries and past D (the padded k-steps add nothing).
  T* q_tile = reinterpret_cast<T*>(shared + layout.q);
  {
    const T* q = static_cast<const T*>(p.q);
    const int cols = round_up16(D);
    for (int e = tid; e < kRows * cols; e += kMmaThreads) {
      const int r = e / cols, d = e - r * cols;
      const std::int64_t row = first_row + r;
      T value = from_float<T>(0.0f);
      if (row < valid_rows && d < D) {
        const std::int64_t i = row / p.group;
        const int h = kv_head * p.group + static_cast<int>(row % p.group);
        const std::int64_t token = p.cu_seqlens_q == nullptr ? i : q_first + i;
        value = q[row_offset(p.q_rows, p.cu_seqlens_q == nullptr ? b : 0, token, h) + d];
      }
      q_tile[r * layout.k_pitch + d] = value;
    }
  }

  // The keys any row of the tile sees, then this split's part (whole kTileKeys tiles), as the
  // CUDA-core kernel does with its own tile size.
  const std::int64_t last_row =
      (valid_rows < first_row + kRows ? valid_rows : first_row + kRows) - 1;
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

  // This lane's rows g and g + 8: valid, and their positions (for the masks).
  bool row_valid[2];
  std::int64_t position[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const std::int64_t row = first_row + g + 8 * h;
    row_valid[h] = row < valid_rows;
    position[h] = keys - q_count + row / p.group;
  }

  auto* offsets = reinterpret_cast<std::int64_t*>(shared + layout.offsets);  // [2][kTileKeys][2]
  unsigned char* ring = shared;
  std::int64_t next_k = -1, next_v = -1;  // offsets of this thread's key of a tile not yet issued
  auto look_up = [&](int u) {
    if (tid < kTileKeys) {
      key_row_offsets(p, b, kv_head, begin + static_cast<std::int64_t>(u) * kTileKeys + tid, end,
                      &next_k, &next_v);
    }
  };
  auto publish = [&](int u) {  // into slot u % 2; read by copy_tile(u) after the next barrier
    if (tid < kTileKeys) {
      offsets[(u % 2) * kTileKeys * 2 + tid * 2] = next_k;
      offsets[(u % 2) * kTileKeys * 2 + tid * 2 + 1] = next_v;
    }
  };
  auto issue =
      [&](int u) {  // tile u into stage u % stages, one commit group (empty past the tiles)
        if (u < tiles) {
          copy_tile<T>(p, offsets + (u % 2) * kTileKeys * 2, ring + (u % stages) * layout.stage,
                       layout, tid);
        }
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

  // Per-lane A fragments of Q (rows r + 8 (i % 2), columns 8 (i / 2) of each k-step; i = lane / 8).
  const int mi = lane / 8, mr = lane % 8;
  const std::uint32_t q_address =
      tile::shared_address(q_tile + (mr + (mi % 2) * 8) * layout.k_pitch + (mi / 2) * 8);
  std::uint32_t q_frag[kQSteps][4];
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      if (ks < d_steps) tile::ldmatrix_x4(q_frag[ks], q_address + ks * 32);
    }
  }
  // ldmatrix row addresses within a stage: K rows are keys (matrices: keys +8 (i / 2), columns +8
  // (i % 2)); V rows are keys too, read transposed (keys +8 (i % 2), columns +8 (i / 2)).
  const int k_lane = (warp * kWarpKeys + mr + (mi / 2) * 8) * layout.k_pitch + (mi % 2) * 8;
  const int v_lane = (warp * kWarpKeys + mr + (mi % 2) * 8) * layout.v_pitch + (mi / 2) * 8;

  float o[kOutTiles][4];
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};  // log2 units, rows g and g + 8
  float row_sum[2] = {0.0f, 0.0f};            // this lane's part (its key columns)
  const float scale_log2 = p.scale * kLog2e;

#pragma unroll 1
  for (int t = 0; t < tiles; ++t) {
    cp_async_wait_stages(stages);  // this thread's copies of tile t have landed
    __syncthreads();               // everyone's; stage (t - 1) % stages is free again
    look_up(t + stages);
    issue(t + stages - 1);
    const std::int64_t key0 = begin + static_cast<std::int64_t>(t) * kTileKeys + warp * kWarpKeys;
    if (key0 < end) {  // warp-uniform: past the split's end the sub-tile holds only zero rows
      unsigned char* stage = ring + (t % stages) * layout.stage;
      const std::uint32_t k_address = tile::shared_address(reinterpret_cast<T*>(stage) + k_lane);
      const std::uint32_t v_address =
          tile::shared_address(reinterpret_cast<T*>(stage + layout.v_in_stage) + v_lane);

      // S = Q K^T over the warp's 16 keys: s[n] holds keys 8n .. 8n + 7.
      float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        if (ks < d_steps) {
          std::uint32_t k_frag[4];
          tile::ldmatrix_x4(k_frag, k_address + ks * 32);
          if constexpr (kQInRegisters) {
            tile::mma_m16n8k16<T>(s[0], q_frag[ks], k_frag[0], k_frag[1]);
            tile::mma_m16n8k16<T>(s[1], q_frag[ks], k_frag[2], k_frag[3]);
          } else {
            tile::ldmatrix_x4(q_frag[0], q_address + ks * 32);
            tile::mma_m16n8k16<T>(s[0], q_frag[0], k_frag[0], k_frag[1]);
            tile::mma_m16n8k16<T>(s[1], q_frag[0], k_frag[2], k_frag[3]);
          }
        }
      }

      // Scores in log2 units; the masks only where the sub-tile is not visible to every row.
      const bool whole = key0 + kWarpKeys <= end &&
                         (!p.has_upper || key0 + kWarpKeys - 1 <= lowest + p.upper) &&
                         (!p.has_lower || key0 >= highest - p.lower);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[n][e];
          if (p.softcap > 0.0f) {
            x = p.softcap * tanhf(x * p.scale / p.softcap) * kLog2e;
          } else {
            x *= scale_log2;
          }
          if (!whole) {
            const int h = e / 2;
            const std::int64_t key = key0 + 8 * n + 2 * c + (e % 2);
            bool visible = key < end && row_valid[h];
            if (p.has_upper) visible = visible && key <= position[h] + p.upper;
            if (p.has_lower) visible = visible && key >= position[h] - p.lower;
            if (!visible) x = -INFINITY;
          }
          s[n][e] = x;
        }
      }

      // Online softmax of rows g (elements 0, 1) and g + 8 (elements 2, 3).
      float rescale[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float tile_max = quad_max(
            fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1])));
        const float new_max = fmaxf(row_max[h], tile_max);
        const float base = new_max == -INFINITY ? 0.0f : new_max;  // a row with nothing visible yet
        rescale[h] = exp2f(row_max[h] - base);
        row_max[h] = new_max;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          s[n][2 * h] = exp2f(s[n][2 * h] - base);
          s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] - base);
          sum += s[n][2 * h] + s[n][2 * h + 1];
        }
        row_sum[h] = row_sum[h] * rescale[h] + sum;
      }
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) {
        o[n][0] *= rescale[0];
        o[n][1] *= rescale[0];
        o[n][2] *= rescale[1];
        o[n][3] *= rescale[1];
      }

      // O += P V: P's C fragments are the A fragment of one k-step (16 keys).
      const std::uint32_t p_frag[4] = {Ops::pack(s[0][0], s[0][1]), Ops::pack(s[0][2], s[0][3]),
                                       Ops::pack(s[1][0], s[1][1]), Ops::pack(s[1][2], s[1][3])};
#pragma unroll
      for (int n = 0; n < kOutTiles / 2; ++n) {
        if (n < v_pairs) {
          std::uint32_t v_frag[4];
          tile::ldmatrix_x4_trans(v_frag, v_address + n * 32);
          tile::mma_m16n8k16<T>(o[2 * n], p_frag, v_frag[0], v_frag[1]);
          tile::mma_m16n8k16<T>(o[2 * n + 1], p_frag, v_frag[2], v_frag[3]);
        }
      }
    }
    publish(t + stages);
  }

  // Merge the warps: each scales its O by 2^(its max - the block's max) into fp32 tiles over the
  // ring; row max and sum of the block go to shared memory.
  tile::cp_async_wait_all();
  float* warp_max = reinterpret_cast<float*>(shared + layout.stats);  // [kMmaWarps][kRows]
  float* warp_sum = warp_max + kMmaWarps * kRows;                     // [kMmaWarps][kRows]
  float* block_max = warp_sum + kMmaWarps * kRows;                    // [kRows]
  float* block_sum = block_max + kRows;                               // [kRows]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_sum(row_sum[h]);
    if (c == 0) {
      warp_max[warp * kRows + g + 8 * h] = row_max[h];
      warp_sum[warp * kRows + g + 8 * h] = sum;
    }
  }
  __syncthreads();  // the ring is free: every warp has finished its last tile
  float* merged = reinterpret_cast<float*>(shared);  // [kMmaWarps][kRows][o_pitch]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) top = fmaxf(top, warp_max[w * kRows + g + 8 * h]);
    const float weight = row_max[h] == -INFINITY ? 0.0f : exp2f(row_max[h] - top);
    float* out_row = merged + (warp * kRows + g + 8 * h) * layout.o_pitch + 2 * c;
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) {
      if (n < 2 * v_pairs) {
        *reinterpret_cast<float2*>(out_row + 8 * n) =
            make_float2(o[n][2 * h] * weight, o[n][2 * h + 1] * weight);
      }
    }
  }
  if (tid < kRows) {
    float top = -INFINITY;
    for (int w = 0; w < kMmaWarps; ++w) top = fmaxf(top, warp_max[w * kRows + tid]);
    float sum = 0.0f;
    for (int w = 0; w < kMmaWarps; ++w) {
      const float m = warp_max[w * kRows + tid];
      if (m != -INFINITY) sum += warp_sum[w * kRows + tid] * exp2f(m - top);
    }
    block_max[tid] = top;
    block_sum[tid] = sum;
  }
  __syncthreads();

  // Epilogue, as the CUDA-core kernel's: one split writes out and lse (with the sink), several
  // write normalised partials and their lse (log2 units).
  const int out_b = p.cu_seqlens_q == nullptr ? b : 0;
  for (int e = tid; e < kRows * Dv; e += kMmaThreads) {
    const int r = e / Dv, d = e - r * Dv;
    const std::int64_t row = first_row + r;
    if (row >= valid_rows) break;  // rows ascend with e
    const std::int64_t i = row / p.group;
    const int h = kv_head * p.group + static_cast<int>(row % p.group);
    float value = 0.0f;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) value += merged[(w * kRows + r) * layout.o_pitch + d];
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
