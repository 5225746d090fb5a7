// The sm90 kernels' block order (src/cuda/common/block_coords.cuh) checked on the host, no GPU
// needed: when head sections apply (one-sided windows, 8 tiles a head or more, an even head count)
// and how large they grow, the grid they launch, the persistent forward's walk over that grid, and
// the rows of a block's batch, clamped to the tensors whatever the device offsets hold, and the D 256
// fused backward's walk over its query tiles; and a KV cache's lengths.
// The decode also runs on the device; the CUDA suite's CausalHeadSections covers it against the
// reference.
#include <cuda_runtime.h>  // defines __host__ / __device__ for the host compiler
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/common/block_coords.cuh"

namespace fmha_cuda_test {
namespace {

using fmha::cuda::ForwardParams;
using fmha::cuda::head_section_log2_for;
using fmha::cuda::kUnboundedWindow;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

ForwardParams causal() {
  ForwardParams f;
  f.window_left = kUnboundedWindow;
  f.window_right = 0;
  return f;
}

TEST(CudaBlockOrder, SectionsUnderCausalMasksOnly) {
  EXPECT_EQ(head_section_log2_for(ForwardParams{}, 64, 16, kMiB), 0);  // no mask: equal blocks
  ForwardParams window = causal();
  window.window_left = 1024;  // a sliding window: equal blocks but at the borders
  EXPECT_EQ(head_section_log2_for(window, 64, 16, kMiB), 0);
  ForwardParams right_open;  // bottom-right causal's mirror: open on the right only
  right_open.window_left = 0;
  EXPECT_GT(head_section_log2_for(right_open, 64, 16, kMiB), 0);
  EXPECT_EQ(head_section_log2_for(causal(), 7, 16, kMiB), 0);  // under 8 tiles a head
  EXPECT_GT(head_section_log2_for(causal(), 8, 16, kMiB), 0);
}

TEST(CudaBlockOrder, SectionSizes) {
  const ForwardParams f = causal();
  EXPECT_EQ(head_section_log2_for(f, 64, 16, kMiB), 3);      // 8 heads of 1 MiB
  EXPECT_EQ(head_section_log2_for(f, 64, 12, kMiB), 2);      // 4 divides 12, 8 does not
  EXPECT_EQ(head_section_log2_for(f, 64, 7, kMiB), 0);       // odd: head by head
  EXPECT_EQ(head_section_log2_for(f, 64, 16, 4 * kMiB), 2);  // 4 x 4 MiB within 16 MiB
  EXPECT_EQ(head_section_log2_for(f, 64, 16, 8 * kMiB), 1);
  // Two heads even past the budget (GQA H32 / Hkv8 D128 L8192: 16 MiB of Q / dO a kv head).
  EXPECT_EQ(head_section_log2_for(f, 64, 8, 16 * kMiB), 1);
}

TEST(CudaBlockOrder, GridHoldsEveryBlock) {
  ForwardParams f = causal();
  f.batch = 3;
  f.head_section_log2 = 2;
  const dim3 grid = fmha::cuda::batch_grid(f, 9, 12);
  EXPECT_EQ(grid.x, 36u);  // 9 tiles of a section's 4 heads
  EXPECT_EQ(grid.y, 3u);   // 3 sections
  EXPECT_EQ(grid.z, 3u);
  f.head_section_log2 = 0;
  const dim3 plain = fmha::cuda::batch_grid(f, 9, 12);
  EXPECT_EQ(plain.x * plain.y * plain.z, grid.x * grid.y * grid.z);
}

// The persistent sm90 forward walks the grid's tiles by a linear index (tile_index, then
// block_coords as for a block of that grid): every (batch, head, tile) once, in every grid order.
TEST(CudaBlockOrder, PersistentWalkTakesEveryTileOnce) {
  struct Order {
    int head_section_log2;
    bool batch_innermost;
  };
  for (const Order order : {Order{0, false}, Order{1, false}, Order{2, false}, Order{0, true}}) {
    ForwardParams f = causal();
    f.batch = 3;
    f.head_section_log2 = order.head_section_log2;
    f.batch_innermost = order.batch_innermost;
    constexpr std::int64_t kTiles = 9, kHeads = 12;
    const dim3 grid = fmha::cuda::batch_grid(f, kTiles, kHeads);
    const unsigned total = grid.x * grid.y * grid.z;
    ASSERT_EQ(total, static_cast<unsigned>(kTiles * kHeads * f.batch));
    std::vector<int> seen(static_cast<std::size_t>(total), 0);
    for (unsigned t = 0; t < total; ++t) {
      const uint3 index = fmha::cuda::tile_index(t, grid);
      ASSERT_LT(index.x, grid.x);
      ASSERT_LT(index.y, grid.y);
      ASSERT_LT(index.z, grid.z);
      EXPECT_EQ(index.x + grid.x * (index.y + grid.y * index.z), t);  // x fastest, as launched
      const fmha::cuda::BlockCoords c = fmha::cuda::block_coords<true>(f, index, grid);
      ASSERT_EQ(c.tiles, kTiles);
      ASSERT_TRUE(c.batch >= 0 && c.batch < f.batch && c.head >= 0 && c.head < kHeads &&
                  c.tile >= 0 && c.tile < kTiles)
          << "tile " << t << " of order " << order.head_section_log2 << "/"
          << order.batch_innermost;
      ++seen[static_cast<std::size_t>((c.batch * kHeads + c.head) * kTiles + c.tile)];
    }
    for (unsigned i = 0; i < total; ++i) EXPECT_EQ(seen[i], 1) << "work item " << i;
  }
}

// A batch's rows (sequence_rows): the dense batch's whole sequences from row 0 (its batch stride
// does the rest), a varlen batch's packed sequences from their cu_seqlens offsets, empty ones
// included.
TEST(CudaBlockOrder, SequenceRowsOfDenseAndVarlenBatches) {
  ForwardParams dense;
  dense.seqlen_q = 300;
  dense.seqlen_k = 77;
  const fmha::cuda::SequenceRows d = fmha::cuda::sequence_rows(dense, 2);
  EXPECT_EQ(d.q_start, 0);
  EXPECT_EQ(d.k_start, 0);
  EXPECT_EQ(d.num_queries, 300);
  EXPECT_EQ(d.num_keys, 77);
  const std::int32_t cu_q[] = {0, 5, 5, 12}, cu_k[] = {0, 9, 20, 20};
  ForwardParams varlen = dense;
  varlen.cu_seqlens_q = cu_q;
  varlen.cu_seqlens_k = cu_k;
  varlen.total_q = 12;
  varlen.total_k = 20;
  const fmha::cuda::SequenceRows first = fmha::cuda::sequence_rows(varlen, 0);
  EXPECT_EQ(first.q_start, 0);
  EXPECT_EQ(first.num_queries, 5);
  EXPECT_EQ(first.k_start, 0);
  EXPECT_EQ(first.num_keys, 9);
  const fmha::cuda::SequenceRows no_queries = fmha::cuda::sequence_rows(varlen, 1);
  EXPECT_EQ(no_queries.q_start, 5);
  EXPECT_EQ(no_queries.num_queries, 0);
  EXPECT_EQ(no_queries.k_start, 9);
  EXPECT_EQ(no_queries.num_keys, 11);
  const fmha::cuda::SequenceRows no_keys = fmha::cuda::sequence_rows(varlen, 2);
  EXPECT_EQ(no_keys.q_start, 5);
  EXPECT_EQ(no_keys.num_queries, 7);
  EXPECT_EQ(no_keys.k_start, 20);
  EXPECT_EQ(no_keys.num_keys, 0);
}

// Device offsets are never checked on the host (unless asked), so sequence_rows clamps what it
// reads: whatever they hold, a sequence's rows stay within [0, total) and its length within
// max_seqlen (seqlen_q / seqlen_k); a decreasing pair is an empty sequence; valid offsets pass
// unchanged (above).
TEST(CudaBlockOrder, SequenceRowsClampBadOffsets) {
  constexpr std::int32_t kMax = 2147483647, kMin = -2147483647 - 1;
  const std::int32_t cu_q[] = {-7, 30, 10, 200, kMax, kMin, 40};
  const std::int32_t cu_k[] = {kMin, kMax, 0, 5, -3, 48, 48};
  ForwardParams f;
  f.cu_seqlens_q = cu_q;
  f.cu_seqlens_k = cu_k;
  f.total_q = 40, f.total_k = 48;  // rows of q and of k
  f.seqlen_q = 25, f.seqlen_k = 30;  // max_seqlen_q, max_seqlen_k
  struct Expected {
    std::int64_t q_start, num_queries, k_start, num_keys;
  };
  const Expected expected[] = {
      {0, 25, 0, 30},   // q [-7, 30): from 0, cut to 25; k [min, max): [0, 48) cut to 30
      {30, 0, 48, 0},   // q [30, 10): decreasing, empty; k [max, 0): from 48, empty
      {10, 25, 0, 5},   // q [10, 200): to 40, 30 rows cut to 25; k [0, 5)
      {40, 0, 5, 0},    // q [200, max): from 40, empty; k [5, -3): decreasing, empty
      {40, 0, 0, 30},   // q [max, min): empty at the end; k [-3, 48): from 0, cut to 30
      {0, 25, 48, 0},   // q [min, 40): from 0, cut to 25; k [48, 48): empty
  };
  for (std::int64_t b = 0; b < 6; ++b) {
    const fmha::cuda::SequenceRows r = fmha::cuda::sequence_rows(f, b);
    const Expected& e = expected[b];
    EXPECT_EQ(r.q_start, e.q_start) << "sequence " << b;
    EXPECT_EQ(r.num_queries, e.num_queries) << "sequence " << b;
    EXPECT_EQ(r.k_start, e.k_start) << "sequence " << b;
    EXPECT_EQ(r.num_keys, e.num_keys) << "sequence " << b;
    EXPECT_LE(r.q_start + r.num_queries, f.total_q) << "sequence " << b;
    EXPECT_LE(r.k_start + r.num_keys, f.total_k) << "sequence " << b;
  }
}

// Attention over a KV cache (kv_cache_forward.cu): a batch's keys are its first seqused_k[b] rows
// from row 0 of its own cache (the batch stride, or the block table, does the rest), the length
// clamped to [0, seqlen_k], the capacity, whatever the device holds; the queries are dense, or
// packed by cu_seqlens_q (clamped as above).
TEST(CudaBlockOrder, SequenceRowsOfKvCacheLengths) {
  constexpr std::int32_t kMax = 2147483647, kMin = -2147483647 - 1;
  const std::int32_t used[] = {300, -1, -5, -1, 1000, -1, kMax, -1, kMin, -1, 0};  // stride 2
  ForwardParams f;
  f.seqlen_q = 40;
  f.seqlen_k = 512;  // the capacity
  f.seqused_k = used;
  f.seqused_k_stride = 2;
  const std::int64_t expected_keys[] = {300, 0, 512, 512, 0, 0};
  for (std::int64_t b = 0; b < 6; ++b) {
    const fmha::cuda::SequenceRows r = fmha::cuda::sequence_rows(f, b);
    EXPECT_EQ(r.q_start, 0) << "batch " << b;
    EXPECT_EQ(r.num_queries, 40) << "batch " << b;
    EXPECT_EQ(r.k_start, 0) << "batch " << b;
    EXPECT_EQ(r.num_keys, expected_keys[b]) << "batch " << b;
  }
  const std::int32_t cu_q[] = {0, 7, 7, 300};
  f.cu_seqlens_q = cu_q;
  f.total_q = 60;
  const fmha::cuda::SequenceRows packed = fmha::cuda::sequence_rows(f, 2);
  EXPECT_EQ(packed.q_start, 7);
  EXPECT_EQ(packed.num_queries, 40);  // [7, 300): to 60, 53 rows cut to max_seqlen_q
  EXPECT_EQ(packed.k_start, 0);
  EXPECT_EQ(packed.num_keys, 512);
}

// The D 256 fused backward's walk (QueryWalk): every (query head, query tile) of a block's group once,
// head after head, each head's tiles from the block's first tile on, wrapping around; the producer
// and the math warpgroups step through the same walk, so they agree on every step's tile.
TEST(CudaBlockOrder, QueryWalkVisitsEveryTileOfEveryHeadOnce) {
  for (int count = 1; count <= 9; ++count) {
    for (int group = 1; group <= 3; ++group) {
      for (int first = 0; first < count; ++first) {
        fmha::cuda::QueryWalk walk{5 * group, first, 0};  // kv head 5's first query head
        std::vector<int> seen(static_cast<std::size_t>(count * group), 0);
        for (int u = 0; u < count * group; ++u) {
          const int head = walk.head - 5 * group;
          ASSERT_GE(head, 0);
          ASSERT_LT(head, group);
          ASSERT_EQ(head, u / count) << "count " << count << " step " << u;
          ASSERT_EQ(walk.m_tile, (first + u % count) % count) << "count " << count << " step " << u;
          ++seen[static_cast<std::size_t>(head * count + walk.m_tile)];
          walk.advance(count);
        }
        for (int v : seen) EXPECT_EQ(v, 1) << "count " << count << " first " << first;
        EXPECT_EQ(walk.head, 6 * group);  // past the group
        EXPECT_EQ(walk.m_tile, first);
      }
    }
  }
}

}  // namespace
}  // namespace fmha_cuda_test
