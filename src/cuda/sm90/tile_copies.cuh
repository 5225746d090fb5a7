// Copies of whole tiles by the tensor-memory accelerator (TMA, cp.async.bulk.tensor), and the
// mbarriers that hand shared-memory stages from a copy warpgroup to the math warpgroups.
//
// Tensor maps. A 16-bit operand [B, L, H, D] with any strides is described as a 4-D tensor whose
// first dimension is the head dim (contiguous) and whose other three are rows, heads and batches
// in order of increasing stride (the driver wants outer strides that grow; a size-1 dimension
// goes last). One copy fills a column block of a SwizzledTile (wgmma.cuh): a box of kBlockCols
// columns x kRows rows of one (head, batch), written with the tile's own swizzle (128-byte
// swizzling for 64-column blocks, 64-byte for 32), so the layout is exactly the one the cp.async
// loaders write. Rows past L and columns past D come back as zeros, as the loaders zero-fill them.
// Where the driver refuses a map (a stride that is not a multiple of 16 bytes, say) the launcher
// marks it unusable and the copy warpgroup loads those tiles with cp.async instead.
//
// Stage hand-off (forward_pipeline.cuh). Each stage has a `full` barrier, on which the 128 copy
// threads arrive once per fill (each through cp.async.mbarrier.arrive.noinc, so that the arrival
// waits for its own cp.async copies, or, where rows are copied element by element, a plain
// arrival that releases those stores; one thread first announces the bytes the TMA copies of the
// fill will complete), and an `empty` barrier, on which each math warp arrives once it no longer
// reads the stage. A barrier's phases alternate parity 0, 1, 0, ...: use n of a stage waits for
// parity n % 2.
#pragma once

#include <cuda.h>  // CUtensorMap and the encode function's signature (the function: driver, at run time)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cuda/ptx>
#include <utility>

#include "cuda/common/env_switch.h"
#include "cuda/common/forward_params.h"

namespace fmha::cuda::sm90 {

// The coordinates of a tile's first element in a map: column, then the three outer dimensions in
// the map's order (kRowDim, kHeadDim, kBatchDim as the map's `order` lists them).
inline constexpr int kRowDim = 0, kHeadDim = 1, kBatchDim = 2;

struct RowsMap {
  CUtensorMap map;
  int order[3];  // order[i]: which of row / head / batch is the map's dimension i + 1
};

// The forward kernel's maps of q, k and v; `usable` is false where any of them could not be made.
// `bias`: a 16-bit bias's rows of queries (columns = keys), in blocks of a key tile's columns,
// where the kernel stages the bias by TMA (bias_usable: mainloop_fwd.cuh). `out`: the output's
// rows in boxes of a warp's 16, where the epilogue stores them by TMA (out_usable).
struct ForwardTileMaps {
  RowsMap q, k, v, bias, out;
  bool usable = false;
  // Rows of one box of k and v: a key tile, or over a paged KV cache a page (or a key tile's
  // share of one), whose maps then describe the whole pool (encode_pool_maps).
  int kv_box_rows = 0;
  bool bias_usable = false;
  bool out_usable = false;
};

// The split backward's maps (mainloop_bwd_dq.cuh, mainloop_bwd_dkdv.cuh): k and v in the dQ
// kernel's key tiles (kv_usable), and a 16-bit bias's query rows in blocks of a key tile's columns
// (bias_usable), where the kernel copies them by TMA.
struct BackwardTileMaps {
  RowsMap k, v, bias;
  bool kv_usable = false;
  bool bias_usable = false;
};

#ifdef __CUDACC__
// Per-stage `full` barriers of a kernel without a copy warpgroup whose stages TMA fills (the
// backward's): stage u % kStages holds step u once the phase of parity (u / kStages) % 2 has
// completed (the copying thread's arrival with the bytes of its copies). In static shared memory,
// so that the dynamic layout stays as the launch counts it.
// Every thread of the block calls it; thread 0 sets them up (one arrival each) before the barrier.
template <int kStages>
__device__ __forceinline__ std::uint64_t* init_stage_barriers() {
  __shared__ std::uint64_t full[kStages];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) ::cuda::ptx::mbarrier_init(&full[s], 1u);
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  __syncthreads();
  return full;
}
#endif

// ---- Host -------------------------------------------------------------------------------------

// Whether launchers may use tensor maps: FMHA_SM90_TMA=0 in the environment (read once) keeps
// every tile on the copy threads' cp.async, so that the GPU suite can run that path on inputs the
// maps would take (scripts/gpu-check.sh).
inline bool tma_enabled() {
  static const bool enabled = !switched_off_by_env("FMHA_SM90_TMA");
  return enabled;
}

// Whether the forward's epilogue may store its output rows by TMA (mainloop_fwd.cuh):
// FMHA_SM90_TMA_STORE=0 (read once) keeps the threads' own 16-byte stores, for comparing the two.
inline bool tma_store_enabled() {
  static const bool enabled = !switched_off_by_env("FMHA_SM90_TMA_STORE");
  return enabled;
}

using TensorMapEncode =
    CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled, looked up once; nullptr where the driver has none.
inline TensorMapEncode tensor_map_encoder() {
  static const TensorMapEncode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                           cudaEnableDefault, &found);
#else  // toolkits before 12.5 have only the unversioned lookup
    const cudaError_t e =
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<TensorMapEncode>(nullptr);
    }
    return reinterpret_cast<TensorMapEncode>(fn);
  }();
  return encode;
}

// The dimensions of a map over a 16-bit tensor at `base` of `cols` columns (contiguous) with rows /
// heads / batches of the given sizes and element strides: the columns, then the outer dimensions
// by increasing byte stride, size-1 ones last (their stride is never used, so it is replaced by
// one that keeps the order growing). False where no tensor map can describe the tensor (the
// driver wants a 16-byte aligned base, outer strides that are multiples of 16 bytes below 2^40,
// sizes below 2^32, no empty dimension).
struct RowsMapLayout {
  cuuint64_t dims[4];
  cuuint64_t strides[3];
  int order[3];
};
inline bool rows_map_layout(RowsMapLayout* out, const void* base, std::int64_t cols,
                            std::int64_t rows, std::int64_t heads, std::int64_t batch,
                            std::int64_t row_stride, std::int64_t head_stride,
                            std::int64_t batch_stride) {
  // The driver refuses empty dimensions (CUDA_ERROR_INVALID_VALUE, which compute-sanitizer reports
  // as an API error): a forward without keys (Lk = 0) takes the cp.async path without asking.
  if (reinterpret_cast<std::uintptr_t>(base) % 16 != 0 || cols <= 0 || rows <= 0 || heads <= 0 ||
      batch <= 0) {
    return false;
  }
  struct Outer {
    int which;
    std::int64_t size, stride;
  } outer[3] = {{kRowDim, rows, row_stride * 2},
                {kHeadDim, heads, head_stride * 2},
                {kBatchDim, batch, batch_stride * 2}};
  auto before = [](const Outer& a, const Outer& b) {
    if ((a.size == 1) != (b.size == 1)) return b.size == 1;
    return a.stride < b.stride;
  };
  for (int i = 0; i < 3; ++i) {
    for (int j = i + 1; j < 3; ++j) {
      if (before(outer[j], outer[i])) std::swap(outer[i], outer[j]);
    }
  }
  std::int64_t extent = cols * 2;  // bytes spanned by the dimensions so far
  out->dims[0] = static_cast<cuuint64_t>(cols);
  for (int i = 0; i < 3; ++i) {
    Outer& o = outer[i];
    if (o.size == 1) o.stride = (extent + 15) / 16 * 16;
    if (o.stride <= 0 || o.stride % 16 != 0 || o.stride >= (std::int64_t{1} << 40) ||
        o.size >= (std::int64_t{1} << 32)) {
      return false;
    }
    out->dims[i + 1] = static_cast<cuuint64_t>(o.size);
    out->strides[i] = static_cast<cuuint64_t>(o.stride);
    out->order[i] = o.which;
    extent = std::max(extent, o.stride * o.size);
  }
  return true;
}

// Whether encode_rows_map would succeed for these tensors (the same checks, without encoding).
inline bool rows_mappable(const void* base, std::int64_t cols, std::int64_t rows,
                          std::int64_t heads, std::int64_t batch, std::int64_t row_stride,
                          std::int64_t head_stride, std::int64_t batch_stride) {
  RowsMapLayout layout;
  return tensor_map_encoder() != nullptr && rows_map_layout(&layout, base, cols, rows, heads, batch,
                                                            row_stride, head_stride, batch_stride);
}

// Fills `out` for a 16-bit tensor at `base` of `cols` columns (contiguous) with rows / heads /
// batches of the given sizes and element strides, copied in boxes of box_cols x box_rows into
// shared memory swizzled by swizzle_bytes (64 or 128). False where the driver has no encoder or
// refuses these strides.
inline bool encode_rows_map(RowsMap* out, const void* base, std::int64_t cols, std::int64_t rows,
                            std::int64_t heads, std::int64_t batch, std::int64_t row_stride,
                            std::int64_t head_stride, std::int64_t batch_stride, int box_cols,
                            int box_rows, int swizzle_bytes) {
  const TensorMapEncode encode = tensor_map_encoder();
  RowsMapLayout layout;
  if (encode == nullptr || !rows_map_layout(&layout, base, cols, rows, heads, batch, row_stride,
                                            head_stride, batch_stride)) {
    return false;
  }
  cuuint32_t box[4] = {static_cast<cuuint32_t>(box_cols), 1, 1, 1};
  for (int i = 0; i < 3; ++i) {
    out->order[i] = layout.order[i];
    if (layout.order[i] == kRowDim) box[i + 1] = static_cast<cuuint32_t>(box_rows);
  }
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return encode(&out->map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void*>(base), layout.dims,
                layout.strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The map of a 16-bit bias's query rows (columns = keys) for copies into a Tile of box_rows rows
// (its column blocks of keys), where those rows are rows of memory (rows broadcast through stride 0
// are not). A batch or head dimension broadcast through stride 0 becomes one of size 1, which the
// kernels read at coordinate 0.
template <typename Tile>
bool encode_bias_map(RowsMap* out, const ForwardParams& f, int box_rows) {
  return f.bias_stride[2] != 0 &&
         encode_rows_map(out, f.bias, f.seqlen_k, f.seqlen_q, f.bias_stride[1] != 0 ? f.heads : 1,
                         f.bias_stride[0] != 0 ? f.batch : 1, f.bias_stride[2], f.bias_stride[1],
                         f.bias_stride[0], Tile::kBlockCols, box_rows, Tile::kSwizzleBytes);
}

// The maps of k and v (both [B, Lk, Hkv, *]) in tiles of box_rows keys of a Tile's column blocks.
template <typename Tile>
bool encode_kv_maps(RowsMap* k, RowsMap* v, const ForwardParams& f, int box_rows) {
  const std::int64_t kv_heads = f.heads / f.kv_group;
  return encode_rows_map(k, f.k, f.head_dim, f.seqlen_k, kv_heads, f.batch, f.k_row_stride,
                         f.k_head_stride, f.k_batch_stride, Tile::kBlockCols, box_rows,
                         Tile::kSwizzleBytes) &&
         encode_rows_map(v, f.v, f.value_dim, f.seqlen_k, kv_heads, f.batch, f.v_row_stride,
                         f.v_head_stride, f.v_batch_stride, Tile::kBlockCols, box_rows,
                         Tile::kSwizzleBytes);
}

// The rows of a box of a paged KV cache's pool map for key tiles of tile_rows rows: a page, or
// the largest power of two that divides tile_rows where pages are longer, so that a tile whose
// first key is a multiple of the box is whole boxes, each inside one page. 0 where pages hold no
// whole 8-row group of the swizzle pattern or are not a power of two (the copy threads gather those).
inline int pool_box_rows(std::int64_t page_size, int tile_rows) {
  const std::int64_t tile_share = tile_rows & -tile_rows;
  if (page_size < 8 || (page_size & (page_size - 1)) != 0) return 0;
  return static_cast<int>(page_size < tile_share ? page_size : tile_share);
}

// The maps of a paged KV cache's k and v pools ([num_pages, page_size, Hkv, *], pages contiguous
// rows: kv_cache_forward_applies) as num_pages * page_size rows of Hkv heads, in boxes of
// box_rows rows of a Tile's column blocks.
template <typename Tile>
bool encode_pool_maps(RowsMap* k, RowsMap* v, const ForwardParams& f, int box_rows) {
  const std::int64_t kv_heads = f.heads / f.kv_group;
  const std::int64_t rows = f.num_pages * f.page_size;
  return encode_rows_map(k, f.k, f.head_dim, rows, kv_heads, 1, f.k_row_stride, f.k_head_stride, 0,
                         Tile::kBlockCols, box_rows, Tile::kSwizzleBytes) &&
         encode_rows_map(v, f.v, f.value_dim, rows, kv_heads, 1, f.v_row_stride, f.v_head_stride,
                         0, Tile::kBlockCols, box_rows, Tile::kSwizzleBytes);
}

// ---- Device -----------------------------------------------------------------------------------

#ifdef __CUDACC__

__device__ __forceinline__ void barrier_init(std::uint64_t* bar, int count) {
  ::cuda::ptx::mbarrier_init(bar, static_cast<std::uint32_t>(count));
}

// Blocks until the barrier's phase of the given parity has completed.
__device__ __forceinline__ void barrier_wait(std::uint64_t* bar, int parity) {
  while (!::cuda::ptx::mbarrier_try_wait_parity(bar, static_cast<std::uint32_t>(parity))) {
  }
}

__device__ __forceinline__ void barrier_arrive(std::uint64_t* bar) {
  (void)::cuda::ptx::mbarrier_arrive(bar);
}

// This thread's arrival, once its cp.async copies issued so far have landed.
__device__ __forceinline__ void barrier_arrive_after_copies(std::uint64_t* bar) {
  ::cuda::ptx::cp_async_mbarrier_arrive_noinc(bar);
}

// The current phase completes only once `bytes` more have been written by TMA copies.
__device__ __forceinline__ void barrier_expect_bytes(std::uint64_t* bar, int bytes) {
  ::cuda::ptx::mbarrier_expect_tx(::cuda::ptx::sem_relaxed, ::cuda::ptx::scope_cta,
                                  ::cuda::ptx::space_shared, bar,
                                  static_cast<std::uint32_t>(bytes));
}

// The arrival of the one thread that copies a tile for a barrier (count 1), announcing the bytes
// its TMA copies will complete: the phase completes once they have landed.
__device__ __forceinline__ void barrier_arrive_expect_bytes(std::uint64_t* bar, int bytes) {
  (void)::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                               ::cuda::ptx::space_shared, bar,
                                               static_cast<std::uint32_t>(bytes));
}

// The coordinates of (row, head, batch) in a map's outer dimensions, in the map's order.
struct OuterCoords {
  std::int32_t c1, c2, c3;
};
__device__ __forceinline__ OuterCoords outer_coords(const RowsMap& m, std::int64_t row, int head,
                                                    std::int64_t batch) {
  // Selects, not an array indexed by the map's order (which went through local memory, a store
  // and a load before every copy).
  auto outer = [&](int which) {
    return which == kRowDim    ? static_cast<std::int32_t>(row)
           : which == kHeadDim ? head
                               : static_cast<std::int32_t>(batch);
  };
  return {outer(m.order[0]), outer(m.order[1]), outer(m.order[2])};
}

// Rows [row, row + the box's rows) of head `head`, batch `batch` (every column block of the tile,
// from column first_col on) into the tile at `dst` (shared memory), completing Tile::kBytes on
// `bar`.
template <typename Tile>
__device__ __forceinline__ void tma_load_tile(std::uint8_t* dst, const RowsMap& m, std::int64_t row,
                                              int head, std::int64_t batch, std::uint64_t* bar,
                                              std::int32_t first_col = 0) {
  const OuterCoords c = outer_coords(m, row, head, batch);
#pragma unroll
  for (int block = 0; block < Tile::kBytes / Tile::kBlockBytes; ++block) {
    const std::int32_t coords[4] = {first_col + block * Tile::kBlockCols, c.c1, c.c2, c.c3};
    ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global,
                                      dst + block * Tile::kBlockBytes, &m.map, coords, bar);
  }
}

// The reverse of tma_load_tile: rows [row, row + the box's rows) of head `head`, batch `batch`
// from the tile rows at `src` (shared memory; column blocks Tile::kBlockBytes apart, the first at
// column first_col) to global memory, in this thread's bulk group (the caller commits it, and
// waits for its reads before it writes those rows again). Rows past L and columns past the map's
// columns are not written; column blocks at or past `cols` are not copied at all.
template <typename Tile>
__device__ __forceinline__ void tma_store_rows(const std::uint8_t* src, const RowsMap& m,
                                               std::int64_t row, int head, std::int64_t batch,
                                               int cols, int first_col = 0) {
  const OuterCoords c = outer_coords(m, row, head, batch);
#pragma unroll
  for (int block = 0; block < Tile::kBytes / Tile::kBlockBytes; ++block) {
    if (first_col + block * Tile::kBlockCols >= cols) break;
    const std::int32_t coords[4] = {first_col + block * Tile::kBlockCols, c.c1, c.c2, c.c3};
    ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_global, ::cuda::ptx::space_shared, &m.map,
                                      coords, src + block * Tile::kBlockBytes);
  }
}

// Keys [first_key, first_key + the tile's rows) of batch b's paged KV cache (p.block_table), every
// one inside the sequence, into the tile at `dst` by TMA through a pool map of encode_pool_maps, a
// box of box_rows rows (first_key a multiple of it) a lane of the calling warp: key r is row
// (page << page_shift) | (r % page size) of the pool, page = the table's entry r >> page_shift
// clamped to [0, num_pages) (bad device tables give wrong numbers, never a read outside the pool).
// Completes Tile::kBytes on `bar`.
template <typename Tile>
__device__ __forceinline__ void tma_load_pages(std::uint8_t* dst, const RowsMap& m,
                                               const ForwardParams& p, std::int64_t b,
                                               int first_key, int box_rows, int head,
                                               std::uint64_t* bar, int lane) {
  constexpr int kRows = Tile::kBlockBytes / Tile::kSwizzleBytes;
  const std::int32_t* const table = p.block_table + b * p.table_batch_stride;
  const int in_page = (1 << p.page_shift) - 1;
  static_assert(kRows <= 32 * 8, "a box of at least 8 rows a lane covers the tile");
  const int row = lane * box_rows;  // of the tile
  if (row < kRows) {
    const int key = first_key + row;
    const int entry = (key >> p.page_shift) * static_cast<int>(p.table_page_stride);
    const int page = min(max(table[entry], 0), static_cast<int>(p.num_pages - 1));
    tma_load_tile<Tile>(dst + row * Tile::kSwizzleBytes, m, (page << p.page_shift) | (key & in_page),
                        head, 0, bar);
  }
}

// `count` floats (a multiple of 4) from `src` (16-byte aligned) to `dst` (shared memory) by one
// bulk copy, completing count * 4 bytes on `bar`.
__device__ __forceinline__ void copy_floats_bulk(std::uint8_t* dst, const float* src, int count,
                                                 std::uint64_t* bar) {
  ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, dst, src,
                             static_cast<std::uint32_t>(count * 4), bar);
}

// The bias tile of query rows from `row` x keys from `first_key` of (batch, head) through a map of
// encode_bias_map: a batch or head broadcast through stride 0 is read at coordinate 0 of its
// size-1 dimension.
template <typename Tile>
__device__ __forceinline__ void tma_load_bias_tile(std::uint8_t* dst, const RowsMap& m,
                                                   const ForwardParams& f, std::int64_t row,
                                                   int head, std::int64_t batch,
                                                   std::int64_t first_key, std::uint64_t* bar) {
  tma_load_tile<Tile>(dst, m, row, f.bias_stride[1] != 0 ? head : 0,
                      f.bias_stride[0] != 0 ? batch : 0, bar, static_cast<std::int32_t>(first_key));
}

#endif  // __CUDACC__

}  // namespace fmha::cuda::sm90
