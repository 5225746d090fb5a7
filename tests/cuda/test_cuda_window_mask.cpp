// The CUDA window mask policy (MaskWindow, src/cuda/common/mask_policies.cuh) checked on the host,
// no GPU needed, against the naive oracle's masks (tests/naive), written from the SPEC formulas:
// causal and sliding windows in both alignments (SPEC §3), and neighborhood attention on one axis
// without dilation, which the CUDA backend runs as a window that shifts at the borders
// (set_neighborhood_mask, SPEC §6). Every answer the kernels use: visible(), key_range() and
// tile_is_full() for blocks of rows, and seen_by() (the backward's transposed question).
#include <cuda_runtime.h>  // defines __host__ / __device__ for the host compiler
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/common/mask_policies.cuh"
#include "cuda/forward_setup.h"
#include "naive/naive_masks.h"

namespace fmha_cuda_test {
namespace {

using fmha::cuda::ForwardParams;
using fmha::cuda::MaskWindow;

// `mask` is [lq, lk], 1 = visible.
void check_window(const MaskWindow& m, const std::vector<char>& mask, std::int64_t lq,
                  std::int64_t lk) {
  auto sees = [&](std::int64_t i, std::int64_t j) {
    return j < lk && mask[static_cast<std::size_t>(i * lk + j)] != 0;
  };
  int wrong = 0;
  for (std::int64_t i = 0; i < lq; ++i) {
    for (std::int64_t j = 0; j < lk + 8; ++j) {  // also keys past the end of a ragged tile
      if (m.visible(i, j) != sees(i, j) && ++wrong <= 5) {
        ADD_FAILURE() << "visible(" << i << ", " << j << ") = " << !sees(i, j);
      }
    }
  }
  // Blocks of rows: key_range holds every key a row sees; a tile claimed full is seen whole.
  for (std::int64_t rows : {1, 16, 64, 128}) {
    for (std::int64_t first = 0; first < lq; first += rows) {
      const std::int64_t last = std::min(first + rows, lq) - 1;
      const fmha::cuda::KeyRange range = m.key_range(first, last);
      for (std::int64_t i = first; i <= last; ++i) {
        for (std::int64_t j = 0; j < lk; ++j) {
          if (sees(i, j) && (j < range.begin || j >= range.end) && ++wrong <= 5) {
            ADD_FAILURE() << "key_range(" << first << ", " << last << ") misses (" << i << ", " << j
                          << ")";
          }
        }
      }
      for (int tile : {64, 128}) {
        for (std::int64_t key = 0; key < lk; key += tile) {
          if (!m.tile_is_full(first, last, key, tile)) continue;
          for (std::int64_t i = first; i <= last; ++i) {
            for (std::int64_t j = key; j < key + tile; ++j) {
              if (!sees(i, j) && ++wrong <= 5) {
                ADD_FAILURE() << "tile at key " << key << " claimed full for rows " << first << ".."
                              << last << ", hides (" << i << ", " << j << ")";
              }
            }
          }
        }
      }
    }
  }
  // seen_by(j): exactly the queries that see key j, as an interval (bounds clipped to the rows).
  for (std::int64_t j = 0; j < lk; ++j) {
    const fmha::cuda::KeySeenBy q = m.seen_by(j);
    for (std::int64_t i = 0; i < lq; ++i) {
      const bool inside = i >= q.first && i <= q.last;
      if (inside != sees(i, j) && ++wrong <= 5) {
        ADD_FAILURE() << "seen_by(" << j << ") = [" << q.first << ", " << q.last << "], but (" << i
                      << ", " << j << ") is " << (sees(i, j) ? "visible" : "hidden");
      }
    }
  }
}

TEST(CudaWindowMaskSmall, CausalAndSlidingWindows) {
  for (auto [lq, lk] : {std::pair<std::int64_t, std::int64_t>{7, 7}, {50, 200}, {200, 50}}) {
    for (bool bottom_right : {false, true}) {
      for (auto [left, right, causal] : {std::tuple{-1L, -1L, true},
                                         {5L, 0L, false},
                                         {3L, 9L, false},
                                         {-1L, 4L, false},
                                         {70L, -1L, true}}) {
        SCOPED_TRACE("lq=" + std::to_string(lq) + " lk=" + std::to_string(lk) +
                     " left=" + std::to_string(left) + " right=" + std::to_string(right) +
                     (causal ? " causal" : "") + (bottom_right ? " bottom-right" : ""));
        ForwardParams p;
        p.bottom_right = bottom_right;
        p.window_left = left < 0 ? fmha::cuda::kUnboundedWindow : left;
        p.window_right = right < 0 ? fmha::cuda::kUnboundedWindow : right;
        if (causal) p.window_right = 0;
        check_window(MaskWindow::make(p, lq, lk),
                     naive::attention_mask(lq, lk, causal, bottom_right, left, right), lq, lk);
      }
    }
  }
}

// One axis of more than one token without dilation becomes the shifting window; anything else
// keeps the neighborhood mask.
TEST(CudaWindowMaskSmall, NeighborhoodOneAxis) {
  for (int x : {1, 2, 13, 64, 200, 301}) {
    for (int k : {1, 2, 3, 4, 7, 8, 63, 64, 65, 199, 200, 300, 301}) {
      if (k > x) continue;
      for (bool causal : {false, true}) {
        for (int axis : {0, 2}) {
          SCOPED_TRACE("X=" + std::to_string(x) + " K=" + std::to_string(k) +
                       (causal ? " causal" : "") + " axis " + std::to_string(axis));
          fmha::cuda::NeighborhoodGrid grid;
          naive::NeighborhoodGeometry ref;
          grid.rank = ref.rank = axis + 1;
          grid.size[axis] = x, grid.kernel[axis] = k, grid.causal[axis] = causal;
          ref.grid[axis] = x, ref.kernel[axis] = k, ref.causal[axis] = causal;
          ForwardParams p;
          fmha::cuda::set_neighborhood_mask(grid, &p);
          ASSERT_EQ(p.neighborhood.rank, 0);
          check_window(MaskWindow::make(p, x, x), naive::neighborhood_mask(ref), x, x);
        }
      }
    }
  }
  ForwardParams dense;  // rank 0: dense attention's own mask is kept
  dense.window_left = 5;
  fmha::cuda::set_neighborhood_mask(fmha::cuda::NeighborhoodGrid{}, &dense);
  EXPECT_EQ(dense.window_left, 5);
  EXPECT_EQ(dense.window_right, fmha::cuda::kUnboundedWindow);
  EXPECT_FALSE(dense.window_shifts_at_borders);
  fmha::cuda::NeighborhoodGrid dilated;
  dilated.rank = 1, dilated.size[0] = 100, dilated.kernel[0] = 7, dilated.dilation[0] = 2;
  ForwardParams p;
  fmha::cuda::set_neighborhood_mask(dilated, &p);
  EXPECT_EQ(p.neighborhood.rank, 1);
  fmha::cuda::NeighborhoodGrid two_axes;
  two_axes.rank = 2, two_axes.size[0] = 4, two_axes.size[1] = 9, two_axes.kernel[1] = 3;
  fmha::cuda::set_neighborhood_mask(two_axes, &p);
  EXPECT_EQ(p.neighborhood.rank, 2);
}

// The tiles a kernel visits for a range of rows: they cover it, start at a multiple of 8 at most
// 7 rows early, and are no more than the range's own rows need from that start.
TEST(CudaWindowMaskSmall, TilesOverRanges) {
  for (std::int64_t begin : {0, 1, 7, 8, 9, 127, 128, 300, 1001}) {
    for (std::int64_t length : {0, 1, 8, 63, 64, 65, 127, 128, 129, 2174}) {
      for (int tile : {64, 128}) {
        const fmha::cuda::TileSpan span = fmha::cuda::tiles_over(begin, begin + length, tile);
        SCOPED_TRACE("begin=" + std::to_string(begin) + " length=" + std::to_string(length) +
                     " tile=" + std::to_string(tile));
        if (length == 0) {
          EXPECT_EQ(span.count, 0);
          continue;
        }
        EXPECT_EQ(span.first_row % 8, 0);
        EXPECT_LE(span.first_row, begin);
        EXPECT_GT(span.first_row, begin - 8);
        EXPECT_GE(span.first_row + span.count * tile, begin + length);        // covers the range
        EXPECT_LT(span.first_row + (span.count - 1) * tile, begin + length);  // no empty tile
      }
    }
  }
}

}  // namespace
}  // namespace fmha_cuda_test
