// Kernels of attention over a KV cache (SPEC §16): the split-KV attention kernel, the combine of its
// partial results, and the append of new tokens. Included by kv_cache.cu only.
//
// Attention kernel. One block owns kRows rows of one (sequence b, kv head): the rows are pairs
// (query i, query head g of the kv head's group), i-major, so for decode (Lq = 1) the whole GQA group
// sits in one tile and every K/V element is read from memory once per group. blockIdx.y picks one of
// num_splits contiguous key ranges of the tile's visible keys. Per tile of kKeys keys: the threads
// look up each key's cache row (block table, clamped), stage K and V in shared memory, compute the
// kRows x kKeys scores (one warp per group of rows, a lane per key), update the online softmax (a warp
// per row: lanes are the tile's keys), then accumulate P V (a thread per output column). The math is
// fp32 on CUDA cores: decode is bound by reading the cache, not by arithmetic (a first version; an
// mma.sync form would serve long prefill better).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/common/dependent_launch.cuh"
#include "cuda/kv_cache_params.h"

namespace fmha::cuda::kv_cache {

constexpr int kRows = 16;     // query rows per block: a GQA group of up to 16 heads at Lq = 1
constexpr int kKeys = 32;     // keys per tile: one per lane in the softmax update
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxHeadDim = 256;
constexpr int kColumnsPerThread = kMaxHeadDim / kThreads;  // P V columns each thread owns
// Splits of a sequence's keys, at most. MQA 32/1 at B 1 runs one block a split: 64 filled a quarter
// of an H200's 264 block slots, 256 fill them (H200, 2026-11-28, the kernels alone: B 1 L 128k
// D 128 0.168 -> 0.090 ms, D 64 0.123 -> 0.066, D 256 0.266 -> 0.139).
constexpr int kMaxSplits = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

static_assert(kKeys == 32, "the softmax update maps the tile's keys onto a warp's lanes");
static_assert(kRows % kWarps == 0, "each warp owns kRows / kWarps rows");

// Shared-memory pitch (in elements) of a K row: even, and an odd number of 32-bit words, so that the
// 32 lanes reading one feature of 32 consecutive keys hit 32 different banks.
__host__ __device__ constexpr int key_pitch(int head_dim) {
  const int even = (head_dim + 1) / 2 * 2;
  return (even / 2) % 2 == 0 ? even + 2 : even;
}

// Byte layout of the dynamic shared memory; the int64 arrays first keep every part aligned.
struct SharedLayout {
  int key_offsets, value_offsets, scores, row_max, row_sum, row_scale, row_position, q, k, v, total;
};

__host__ __device__ constexpr SharedLayout shared_layout(int head_dim, int value_dim, int element) {
  SharedLayout s{};
  int at = 0;
  s.key_offsets = at;
  at += kKeys * 8;
  s.value_offsets = at;
  at += kKeys * 8;
  s.row_position = at;
  at += kRows * 8;
  s.scores = at;
  at += kRows * (kKeys + 1) * 4;
  s.row_max = at;
  at += kRows * 4;
  s.row_sum = at;
  at += kRows * 4;
  s.row_scale = at;
  at += kRows * 4;
  at = (at + 15) / 16 * 16;
  s.q = at;
  at += kRows * head_dim * element;
  at = (at + 15) / 16 * 16;
  s.k = at;
  at += kKeys * key_pitch(head_dim) * element;
  at = (at + 15) / 16 * 16;
  s.v = at;
  at += kKeys * value_dim * element;
  s.total = (at + 15) / 16 * 16;
  return s;
}

// The largest layout fits the 48 KB every block may take without cudaFuncSetAttribute.
static_assert(shared_layout(kMaxHeadDim, kMaxHeadDim, 2).total <= 48 * 1024,
              "the attention kernel's shared memory must fit the default 48 KB");

template <typename T>
__device__ inline float to_float(T x);
template <>
__device__ inline float to_float(__half x) {
  return __half2float(x);
}
template <>
__device__ inline float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline __half from_float(float x) {
  return __float2half_rn(x);
}
template <>
__device__ inline __nv_bfloat16 from_float(float x) {
  return __float2bfloat16_rn(x);
}

__device__ inline std::int64_t clamp64(std::int64_t x, std::int64_t lo, std::int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// The queries of sequence b: first row (token index of q's row dimension) and count. Packed offsets
// are clamped into [0, total_q], an end below its start is an empty run, a run longer than
// max_seqlen_q is cut to it.
__device__ inline void query_run(const KvCacheKernelParams& p, int b, std::int64_t* first,
                                 std::int64_t* count) {
  if (p.cu_seqlens_q == nullptr) {
    *first = 0;
    *count = p.seqlen_q;
    return;
  }
  const std::int64_t start = clamp64(p.cu_seqlens_q[b * p.cu_stride], 0, p.total_q);
  const std::int64_t end = clamp64(p.cu_seqlens_q[(b + 1) * p.cu_stride], start, p.total_q);
  *first = start;
  *count = end - start < p.seqlen_q ? end - start : p.seqlen_q;
}

// Global row number of query i of sequence b (for the workspace and the combine): token * H + h.
__device__ inline std::int64_t query_token(const KvCacheKernelParams& p, int b, std::int64_t first,
                                           std::int64_t i) {
  return p.cu_seqlens_q == nullptr ? static_cast<std::int64_t>(b) * p.seqlen_q + i : first + i;
}

__device__ inline std::int64_t row_offset(const QueryRows& rows, int b, std::int64_t token_in_dim,
                                          int h) {
  return b * rows.batch + token_in_dim * rows.row + h * rows.head;
}

// Offset in q of row `row` of a (sequence b, kv head) pair's rows (query row / group, head
// kv_head * group + row % group), row below the sequence's q_count * group.
__device__ inline std::int64_t query_row_offset(const KvCacheKernelParams& p, int b, int kv_head,
                                                std::int64_t q_first, std::int64_t row) {
  const std::int64_t i = row / p.group;
  const int h = kv_head * p.group + static_cast<int>(row - i * p.group);
  const std::int64_t token = p.cu_seqlens_q == nullptr ? i : q_first + i;
  return row_offset(p.q_rows, p.cu_seqlens_q == nullptr ? b : 0, token, h);
}

__device__ inline float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ inline float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// A row's finish where one split saw all its keys: the sink of head h folded into its running
// (max2, sum) (log2 units); weight scales the unnormalised output, lse is in natural units (-inf
// for a row that saw nothing).
struct RowFinish {
  float weight, lse;
};
__device__ inline RowFinish finish_row(const KvCacheKernelParams& p, int h, float max2, float sum) {
  float total_max = max2, total = sum;
  if (p.sinks != nullptr) {
    const float sink2 = p.sinks[h * p.sinks_stride] * kLog2e;
    total_max = fmaxf(max2, sink2);
    total = (sum > 0.0f ? sum * exp2f(max2 - total_max) : 0.0f) + exp2f(sink2 - total_max);
  }
  return {total > 0.0f && sum > 0.0f ? exp2f(max2 - total_max) / total : 0.0f,
          total > 0.0f ? (total_max + log2f(total)) * kLn2 : -INFINITY};
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    kv_cache_attention_kernel(const __grid_constant__ KvCacheKernelParams p) {
  extern __shared__ __align__(16) unsigned char shared[];
  constexpr int kElement = sizeof(T);
  const SharedLayout layout = shared_layout(p.head_dim, p.value_dim, kElement);
  auto* key_offsets = reinterpret_cast<std::int64_t*>(shared + layout.key_offsets);
  auto* value_offsets = reinterpret_cast<std::int64_t*>(shared + layout.value_offsets);
  auto* row_position = reinterpret_cast<std::int64_t*>(shared + layout.row_position);
  auto* scores = reinterpret_cast<float*>(shared + layout.scores);
  auto* row_max = reinterpret_cast<float*>(shared + layout.row_max);
  auto* row_sum = reinterpret_cast<float*>(shared + layout.row_sum);
  auto* row_scale = reinterpret_cast<float*>(shared + layout.row_scale);
  auto* q_tile = reinterpret_cast<T*>(shared + layout.q);
  auto* k_tile = reinterpret_cast<T*>(shared + layout.k);
  auto* v_tile = reinterpret_cast<T*>(shared + layout.v);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int tile = blockIdx.x % p.row_tiles;
  const int kv_head = (blockIdx.x / p.row_tiles) % p.kv_heads;
  const int b = blockIdx.x / p.row_tiles / p.kv_heads;
  const int split = blockIdx.y;
  const int D = p.head_dim, Dv = p.value_dim, pitch = key_pitch(D);

  std::int64_t q_first = 0, q_count = 0;
  query_run(p, b, &q_first, &q_count);
  const std::int64_t first_row = static_cast<std::int64_t>(tile) * kRows;
  if (first_row >= q_count * p.group) return;  // the whole tile is past this sequence's queries
  const std::int64_t keys = clamp64(p.cache_seqlens[b * p.seqlens_stride], 0, p.capacity);

  // Rows: (query i, head g) = (row / group, row % group); position of query i = keys - Lq + i.
  if (tid < kRows) {
    const std::int64_t row = first_row + tid;
    row_position[tid] = row < q_count * p.group ? keys - q_count + row / p.group : INT64_MIN;
    row_max[tid] = -INFINITY;
    row_sum[tid] = 0.0f;
  }
  const T* q = static_cast<const T*>(p.q);
  for (int e = tid; e < kRows * D; e += kThreads) {
    const int r = e / D, d = e - r * D;
    const std::int64_t row = first_row + r;
    q_tile[e] = row < q_count * p.group ? q[query_row_offset(p, b, kv_head, q_first, row) + d]
                                        : from_float<T>(0.0f);
  }
  __syncthreads();

  // The keys any row of the tile sees, then this split's part of them (whole tiles of kKeys).
  const std::int64_t last_row = (q_count * p.group < first_row + kRows ? q_count * p.group : first_row + kRows) - 1;
  const std::int64_t lowest = keys - q_count + first_row / p.group;
  const std::int64_t highest = keys - q_count + last_row / p.group;
  std::int64_t begin = p.has_lower ? clamp64(lowest - p.lower, 0, keys) : 0;
  std::int64_t end = p.has_upper ? clamp64(highest + p.upper + 1, 0, keys) : keys;
  if (end < begin) end = begin;
  const std::int64_t chunk = ((end - begin + p.num_splits - 1) / p.num_splits + kKeys - 1) / kKeys * kKeys;
  begin = begin + split * chunk < end ? begin + split * chunk : end;
  end = begin + chunk < end ? begin + chunk : end;

  // Registers only: every index into acc is a compile-time constant (fully unrolled loops).
  float acc[kRows][kColumnsPerThread];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < kColumnsPerThread; ++c) acc[r][c] = 0.0f;

  const T* k_cache = static_cast<const T*>(p.k.data);
  const T* v_cache = static_cast<const T*>(p.v.data);
  for (std::int64_t key0 = begin; key0 < end; key0 += kKeys) {
    // Cache rows of the tile's keys; a page index from the block table is clamped to the pool.
    if (tid < kKeys) {
      const std::int64_t key = key0 + tid;
      std::int64_t k_offset = -1, v_offset = -1;
      if (key < end) {
        std::int64_t page = b;
        if (p.block_table != nullptr) {
          page = clamp64(p.block_table[b * p.table_batch + (key / p.page_size) * p.table_page], 0,
                         p.num_pages - 1);
        }
        const std::int64_t row = key % p.page_size;
        k_offset = page * p.k.page + row * p.k.row + kv_head * p.k.head;
        v_offset = page * p.v.page + row * p.v.row + kv_head * p.v.head;
      }
      key_offsets[tid] = k_offset;
      value_offsets[tid] = v_offset;
    }
    __syncthreads();
    if (p.vector_loads) {
      // 16-byte loads (8 elements); K rows land as four 32-bit words (their pitch is only even).
      const int k_chunks = D / 8, v_chunks = Dv / 8;
      for (int e = tid; e < kKeys * k_chunks; e += kThreads) {
        const int j = e / k_chunks, c = e - j * k_chunks;
        const std::int64_t offset = key_offsets[j];
        const uint4 value = offset >= 0 ? *reinterpret_cast<const uint4*>(k_cache + offset + c * 8)
                                        : make_uint4(0u, 0u, 0u, 0u);
        auto* words = reinterpret_cast<std::uint32_t*>(k_tile + j * pitch + c * 8);
        words[0] = value.x;
        words[1] = value.y;
        words[2] = value.z;
        words[3] = value.w;
      }
      for (int e = tid; e < kKeys * v_chunks; e += kThreads) {
        const int j = e / v_chunks, c = e - j * v_chunks;
        const std::int64_t offset = value_offsets[j];
        *reinterpret_cast<uint4*>(v_tile + j * Dv + c * 8) =
            offset >= 0 ? *reinterpret_cast<const uint4*>(v_cache + offset + c * 8)
                        : make_uint4(0u, 0u, 0u, 0u);
      }
    } else {
      for (int e = tid; e < kKeys * D; e += kThreads) {
        const int j = e / D, d = e - j * D;
        const std::int64_t offset = key_offsets[j];
        k_tile[j * pitch + d] = offset >= 0 ? k_cache[offset + d] : from_float<T>(0.0f);
      }
      for (int e = tid; e < kKeys * Dv; e += kThreads) {
        const int j = e / Dv, d = e - j * Dv;
        const std::int64_t offset = value_offsets[j];
        v_tile[e] = offset >= 0 ? v_cache[offset + d] : from_float<T>(0.0f);
      }
    }
    __syncthreads();

    // Scores in log2 units: lane j is key key0 + j; warp w owns rows w, w + kWarps, ...
    {
      constexpr int kRowsPerWarp = kRows / kWarps;
      float dot[kRowsPerWarp];
#pragma unroll
      for (int n = 0; n < kRowsPerWarp; ++n) dot[n] = 0.0f;
      for (int d = 0; d < D; ++d) {
        const float k = to_float(k_tile[lane * pitch + d]);
#pragma unroll
        for (int n = 0; n < kRowsPerWarp; ++n) dot[n] += to_float(q_tile[(warp + n * kWarps) * D + d]) * k;
      }
      const std::int64_t key = key0 + lane;
#pragma unroll
      for (int n = 0; n < kRowsPerWarp; ++n) {
        const int r = warp + n * kWarps;
        const std::int64_t position = row_position[r];
        bool visible = key < end && position != INT64_MIN;
        if (p.has_upper) visible = visible && key <= position + p.upper;
        if (p.has_lower) visible = visible && key >= position - p.lower;
        float s = dot[n] * p.scale;
        if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
        scores[r * (kKeys + 1) + lane] = visible ? s * kLog2e : -INFINITY;
      }
    }
    __syncthreads();

    // Online softmax: warp w updates its rows' maxima and sums; the scores become probabilities.
    for (int r = warp; r < kRows; r += kWarps) {
      const float s = scores[r * (kKeys + 1) + lane];
      const float old_max = row_max[r];
      const float new_max = fmaxf(old_max, warp_max(s));
      const float prob = new_max == -INFINITY ? 0.0f : exp2f(s - new_max);
      scores[r * (kKeys + 1) + lane] = prob;
      const float sum = warp_sum(prob);
      __syncwarp();
      if (lane == 0) {
        const float rescale = new_max == -INFINITY ? 1.0f : exp2f(old_max - new_max);
        row_scale[r] = rescale;
        row_sum[r] = row_sum[r] * rescale + sum;
        row_max[r] = new_max;
      }
    }
    __syncthreads();

    // out += P V: thread t owns columns t, t + kThreads, ...
#pragma unroll
    for (int c = 0; c < kColumnsPerThread; ++c) {
      const int d = tid + c * kThreads;
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r][c] *= row_scale[r];
      if (d < Dv) {
        for (int j = 0; j < kKeys; ++j) {
          const float v = to_float(v_tile[j * Dv + d]);
#pragma unroll
          for (int r = 0; r < kRows; ++r) acc[r][c] += scores[r * (kKeys + 1) + j] * v;
        }
      }
    }
    __syncthreads();
  }

  // Epilogue: normalise; one split writes out and lse (with the sink), several write partials.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t row = first_row + r;
    if (row >= q_count * p.group) continue;
    const std::int64_t i = row / p.group;
    const int h = kv_head * p.group + static_cast<int>(row % p.group);
    const float max2 = row_max[r], sum = row_sum[r];
    if (p.num_splits > 1) {
      const std::int64_t part_row =
          static_cast<std::int64_t>(split) * p.total_q * p.heads + query_token(p, b, q_first, i) * p.heads + h;
      const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
      for (int c = 0; c < kColumnsPerThread; ++c) {
        const int d = tid + c * kThreads;
        if (d < Dv) p.partial_out[part_row * Dv + d] = acc[r][c] * inverse;
      }
      if (tid == 0) p.partial_lse[part_row] = sum > 0.0f ? max2 + log2f(sum) : -INFINITY;
      continue;
    }
    const RowFinish finish = finish_row(p, h, max2, sum);
    const int out_b = p.cu_seqlens_q == nullptr ? b : 0;
    const std::int64_t token = p.cu_seqlens_q == nullptr ? i : q_first + i;
    T* out = static_cast<T*>(p.out) + row_offset(p.out_rows, out_b, token, h);
#pragma unroll
    for (int c = 0; c < kColumnsPerThread; ++c) {
      const int d = tid + c * kThreads;
      if (d < Dv) out[d] = from_float<T>(acc[r][c] * finish.weight);
    }
    if (tid == 0 && p.lse != nullptr) {
      p.lse[row_offset(p.lse_rows, out_b, token, h)] = finish.lse;
    }
  }
}

// ---- The combine of the splits (SPEC §12; the sink joins here, in exactly one part) ----
// Two forms: a warp a row (query token x head) when a row has few splits, and a block a row when it
// has many, each warp then adding a quarter of them: MQA at B 1 has 32 rows of up to 256 splits, where
// a warp a row waits through 32 rounds of loads (H200, 2026-11-28: the combine 31 of a 90 us decode),
// while at B 64 with a few splits a row the block's barriers cost more than they hide.
constexpr int kWideCombineSplits = 32;  // more splits than this: a block a row

// A row's merge statistics (log2 units): the largest lse of its splits and its sink, and the sum
// of every split's weight 2^(lse2 - total_max), the sink's included.
struct CombineRow {
  float total_max, total;
};

// The column of a lane's value[c] in add_weighted_splits: lane + 32 c, or with float4 loads (kVec4,
// Dv % 4 == 0) 4 lane + 128 (c / 4) + c % 4.
template <bool kVec4>
__device__ inline int combine_column(int lane, int c) {
  return kVec4 ? 4 * lane + 128 * (c / 4) + c % 4 : lane + 32 * c;
}

// Splits [first, end) of `row`, weighted: value[c] += w_s * part_s[combine_column(lane, c)] in split
// order, a lane's columns all at once and kRound splits a round, so that a round's loads are in
// flight together (kVec4: 16 splits of float4 loads a round, 16 KB a warp). Splits of weight 0 are
// skipped.
template <bool kVec4>
__device__ inline void add_weighted_splits(const KvCacheKernelParams& p, std::int64_t row, std::int64_t rows,
                                           const float* weights, int first_split, int end_split, int lane,
                                           float (&value)[kMaxHeadDim / 32]) {
  constexpr int kLaneColumns = kMaxHeadDim / 32;
  constexpr int kLoads = kVec4 ? kLaneColumns / 4 : kLaneColumns, kRound = kVec4 ? 16 : 8;
  using Load = std::conditional_t<kVec4, float4, float>;
  const float* const parts = p.partial_out + row * p.value_dim;
  const std::int64_t split_stride = rows * p.value_dim;
  for (int first = first_split; first < end_split; first += kRound) {
    Load x[kRound][kLoads];
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int s = first + u;
      const bool used = s < end_split && weights[s] != 0.0f;
#pragma unroll
      for (int c = 0; c < kLoads; ++c) {
        const int d = combine_column<kVec4>(lane, kVec4 ? 4 * c : c);
        if (used && d < p.value_dim) {
          x[u][c] = *reinterpret_cast<const Load*>(parts + s * split_stride + d);
        } else {
          x[u][c] = Load{};
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int s = first + u;
      const float w = s < end_split ? weights[s] : 0.0f;
      if (w == 0.0f) continue;
#pragma unroll
      for (int c = 0; c < kLoads; ++c) {
        if constexpr (kVec4) {
          value[4 * c] += w * x[u][c].x;
          value[4 * c + 1] += w * x[u][c].y;
          value[4 * c + 2] += w * x[u][c].z;
          value[4 * c + 3] += w * x[u][c].w;
        } else {
          value[c] += w * x[u][c];
        }
      }
    }
  }
}

// Where the combined row goes: out's row pointer, and lse's element (dense: token = b * Lq + i;
// packed: the row of q itself).
template <typename T>
struct CombineDestination {
  T* out;
  float* lse;
};
template <typename T>
__device__ inline CombineDestination<T> combine_destination(const KvCacheKernelParams& p, std::int64_t row) {
  const std::int64_t token = row / p.heads;
  const int h = static_cast<int>(row % p.heads);
  const int b = p.cu_seqlens_q == nullptr ? static_cast<int>(token / p.seqlen_q) : 0;
  const std::int64_t in_dim = p.cu_seqlens_q == nullptr ? token % p.seqlen_q : token;
  return {static_cast<T*>(p.out) + row_offset(p.out_rows, b, in_dim, h),
          p.lse != nullptr ? p.lse + row_offset(p.lse_rows, b, in_dim, h) : nullptr};
}

__device__ inline float combined_lse(const CombineRow& r) {
  return r.total > 0.0f ? (r.total_max + log2f(r.total)) * kLn2 : -INFINITY;
}

__device__ inline float sink_log2(const KvCacheKernelParams& p, std::int64_t row) {
  return p.sinks != nullptr ? p.sinks[static_cast<int>(row % p.heads) * p.sinks_stride] * kLog2e : -INFINITY;
}

// The combine may be launched while the attention kernel before it in the stream still runs
// (programmatic dependent launch, sm90 and newer: launch_combine's `overlap`), so that its launch
// and its blocks' start overlap that kernel's last blocks; it waits here until that kernel has
// completed and its partials are visible. Without the overlap the wait returns at once.
__device__ __forceinline__ void wait_for_partials() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

// A warp a row (up to kWideCombineSplits splits: one a lane).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    kv_cache_combine_kernel(const __grid_constant__ KvCacheKernelParams p) {
  __shared__ float weights[kWarps][kWideCombineSplits];
  wait_for_partials();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::int64_t rows = p.total_q * p.heads;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kWarps;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp; row < rows; row += stride) {
    const float lse2 = lane < p.num_splits ? p.partial_lse[lane * rows + row] : -INFINITY;
    const float sink2 = sink_log2(p, row);
    CombineRow r{fmaxf(warp_max(lse2), sink2), 0.0f};
    const float w = r.total_max == -INFINITY || lse2 == -INFINITY ? 0.0f : exp2f(lse2 - r.total_max);
    weights[warp][lane] = w;
    r.total = warp_sum(w);
    if (sink2 != -INFINITY) r.total += exp2f(sink2 - r.total_max);
    __syncwarp();
    float value[kMaxHeadDim / 32] = {};
    add_weighted_splits<false>(p, row, rows, weights[warp], 0, p.num_splits, lane, value);
    const float inverse = r.total > 0.0f ? 1.0f / r.total : 0.0f;
    const CombineDestination<T> dst = combine_destination<T>(p, row);
#pragma unroll
    for (int c = 0; c < kMaxHeadDim / 32; ++c) {
      const int d = lane + 32 * c;
      if (d < p.value_dim) dst.out[d] = from_float<T>(value[c] * inverse);
    }
    if (lane == 0 && dst.lse != nullptr) *dst.lse = combined_lse(r);
    __syncwarp();  // weights[warp] is the next row's
  }
}

// A block a row: the block's threads weigh the splits together (two a thread), warp w adds the w-th
// quarter of them for every column, and the four warps' sums are added in warp order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    kv_cache_combine_wide_kernel(const __grid_constant__ KvCacheKernelParams p) {
  static_assert(kMaxSplits % kThreads == 0 && kMaxHeadDim % kThreads == 0, "two splits, two columns a thread");
  constexpr int kSplitsPerThread = kMaxSplits / kThreads;
  __shared__ float weights[kMaxSplits];
  __shared__ float warp_part[kWarps][kMaxHeadDim];
  __shared__ float warp_max2[kWarps], warp_total[kWarps];
  wait_for_partials();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const std::int64_t rows = p.total_q * p.heads;
  const int n = p.num_splits;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float lse2[kSplitsPerThread];
    float max2 = -INFINITY;
#pragma unroll
    for (int i = 0; i < kSplitsPerThread; ++i) {
      const int s = tid + i * kThreads;
      lse2[i] = s < n ? p.partial_lse[s * rows + row] : -INFINITY;
      max2 = fmaxf(max2, lse2[i]);
    }
    max2 = warp_max(max2);
    if (lane == 0) warp_max2[warp] = max2;
    __syncthreads();
    const float sink2 = sink_log2(p, row);
    CombineRow r{sink2, 0.0f};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) r.total_max = fmaxf(r.total_max, warp_max2[w]);
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kSplitsPerThread; ++i) {
      const float w = r.total_max == -INFINITY || lse2[i] == -INFINITY ? 0.0f : exp2f(lse2[i] - r.total_max);
      weights[tid + i * kThreads] = w;
      total += w;
    }
    total = warp_sum(total);
    if (lane == 0) warp_total[warp] = total;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) r.total += warp_total[w];
    if (sink2 != -INFINITY) r.total += exp2f(sink2 - r.total_max);

    const int quarter = (n + kWarps - 1) / kWarps;
    const int first_split = min(n, warp * quarter);
    const int end_split = min(n, first_split + quarter);
    float value[kMaxHeadDim / 32] = {};
    // Rows of whole float4s: Dv a multiple of 4 and the caller's workspace 16-byte aligned.
    if (p.value_dim % 4 == 0 && (reinterpret_cast<std::uintptr_t>(p.partial_out) & 15) == 0) {
      add_weighted_splits<true>(p, row, rows, weights, first_split, end_split, lane, value);
#pragma unroll
      for (int c = 0; c < kMaxHeadDim / 32; ++c) warp_part[warp][combine_column<true>(lane, c)] = value[c];
    } else {
      add_weighted_splits<false>(p, row, rows, weights, first_split, end_split, lane, value);
#pragma unroll
      for (int c = 0; c < kMaxHeadDim / 32; ++c) warp_part[warp][combine_column<false>(lane, c)] = value[c];
    }
    __syncthreads();

    const float inverse = r.total > 0.0f ? 1.0f / r.total : 0.0f;
    const CombineDestination<T> dst = combine_destination<T>(p, row);
#pragma unroll
    for (int i = 0; i < kColumnsPerThread; ++i) {
      const int d = tid + i * kThreads;
      if (d < p.value_dim) {
        float sum = warp_part[0][d];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) sum += warp_part[w][d];
        dst.out[d] = from_float<T>(sum * inverse);
      }
    }
    if (tid == 0 && dst.lse != nullptr) *dst.lse = combined_lse(r);
    __syncthreads();  // the shared arrays are the next row's
  }
}

// Launches the combine form that fits the split count (grids of at most 2^20 blocks walk the rows).
// `overlap`: a programmatic dependent launch on the attention kernel before it (sm90 and newer;
// wait_for_partials); a runtime that refuses it (say, a capture that cannot hold it) gets the
// plain launch.
template <typename T>
cudaError_t launch_combine(const KvCacheKernelParams& k, cudaStream_t stream, bool overlap = false) {
  const std::int64_t rows = k.total_q * k.heads;
  const bool wide = k.num_splits > kWideCombineSplits;
  void (*kernel)(KvCacheKernelParams) =
      wide ? kv_cache_combine_wide_kernel<T> : kv_cache_combine_kernel<T>;
  const std::int64_t wanted = wide ? rows : (rows + kWarps - 1) / kWarps;
  const dim3 grid(static_cast<unsigned>(std::clamp<std::int64_t>(wanted, 1, std::int64_t{1} << 20)));
  return launch_maybe_overlapped(kernel, grid, dim3(kThreads), 0, stream, overlap, k);
}

// One block per new token: copies its K and V rows (all kv heads) into the cache. A token whose
// sequence, position or page is out of range (bad device data) is skipped, never clamped: a
// clamped write would land in another sequence's page.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    kv_cache_append_kernel(const __grid_constant__ KvCacheAppendKernelParams p) {
  const std::int64_t source = blockIdx.x;
  int b = 0;
  std::int64_t n = 0;
  if (p.cu_seqlens_new == nullptr) {
    b = static_cast<int>(source / p.new_tokens);
    n = source % p.new_tokens;
  } else {
    // The last sequence whose (clamped) first row is <= source.
    int lo = 0, hi = p.batch - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (clamp64(p.cu_seqlens_new[mid * p.cu_stride], 0, p.new_tokens) <= source) lo = mid; else hi = mid - 1;
    }
    b = lo;
    const std::int64_t first = clamp64(p.cu_seqlens_new[b * p.cu_stride], 0, p.new_tokens);
    const std::int64_t last = clamp64(p.cu_seqlens_new[(b + 1) * p.cu_stride], 0, p.new_tokens);
    if (source < first || source >= last) return;
    n = source - first;
  }
  const std::int64_t position = clamp64(p.cache_seqlens[b * p.seqlens_stride], 0, p.capacity) + n;
  if (position >= p.capacity) return;
  std::int64_t page = b;
  if (p.block_table != nullptr) {
    page = p.block_table[b * p.table_batch + (position / p.page_size) * p.table_page];
    if (page < 0 || page >= p.num_pages) return;
  }
  const std::int64_t row = position % p.page_size;
  const std::int64_t new_b = p.cu_seqlens_new == nullptr ? b : 0;
  const std::int64_t new_row = p.cu_seqlens_new == nullptr ? n : source;
  const T* k_new = static_cast<const T*>(p.k_new) + new_b * p.k_new_batch + new_row * p.k_new_row;
  const T* v_new = static_cast<const T*>(p.v_new) + new_b * p.v_new_batch + new_row * p.v_new_row;
  T* k_cache = static_cast<T*>(p.k_cache) + page * p.k_page + row * p.k_row;
  T* v_cache = static_cast<T*>(p.v_cache) + page * p.v_page + row * p.v_row;
  for (int e = threadIdx.x; e < p.kv_heads * p.head_dim; e += kThreads) {
    const int h = e / p.head_dim, d = e - h * p.head_dim;
    k_cache[h * p.k_head + d] = k_new[h * p.k_new_head + d];
  }
  for (int e = threadIdx.x; e < p.kv_heads * p.value_dim; e += kThreads) {
    const int h = e / p.value_dim, d = e - h * p.value_dim;
    v_cache[h * p.v_head + d] = v_new[h * p.v_new_head + d];
  }
}

}  // namespace fmha::cuda::kv_cache
