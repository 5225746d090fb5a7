// The CUDA neighborhood mask policy (src/cuda/common/neighborhood_mask.cuh) checked on the host,
// no GPU needed: for many grids and every block of consecutive query rows, key_range() must cover
// every key a row sees, tile_is_full() may claim only tiles every row sees entirely, and visible()
// must equal the SPEC §6 mask of the naive oracle (tests/naive), which is written from the formula;
// for the backward, column_window() must give exactly the queries that see a key and
// query_range() must cover them for every block of consecutive keys.
#include <cuda_runtime.h>  // defines __host__ / __device__ for the host compiler
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/neighborhood_mask.cuh"
#include "naive/naive_masks.h"

namespace fmha_cuda_test {
namespace {

struct Geometry {
  int rank;
  std::vector<int> size, kernel, dilation;
  std::vector<bool> causal;
};

std::string describe(const Geometry& g) {
  std::string s;
  for (int r = 0; r < g.rank; ++r) {
    s += " axis" + std::to_string(r) + "{X=" + std::to_string(g.size[r]) +
         " K=" + std::to_string(g.kernel[r]) + " d=" + std::to_string(g.dilation[r]) +
         (g.causal[r] ? " causal}" : "}");
  }
  return s;
}

void check_geometry(const Geometry& geo) {
  SCOPED_TRACE(describe(geo));
  fmha::cuda::NeighborhoodGrid grid;
  naive::NeighborhoodGeometry ref;
  grid.rank = ref.rank = geo.rank;
  int tokens = 1;
  for (int r = 0; r < geo.rank; ++r) {
    grid.size[r] = geo.size[r];
    grid.kernel[r] = geo.kernel[r];
    grid.dilation[r] = geo.dilation[r];
    grid.causal[r] = geo.causal[r];
    ref.grid[r] = geo.size[r];
    ref.kernel[r] = geo.kernel[r];
    ref.dilation[r] = geo.dilation[r];
    ref.causal[r] = geo.causal[r];
    tokens *= geo.size[r];
  }
  const std::vector<char> mask = naive::neighborhood_mask(ref);  // [tokens, tokens]
  const fmha::cuda::MaskNeighborhood policy{&grid, tokens};
  auto sees = [&](int i, int j) { return mask[static_cast<std::size_t>(i) * tokens + j] != 0; };

  int wrong = 0;
  for (int i = 0; i < tokens; ++i) {
    for (int j = 0; j < tokens + 8; ++j) {  // also keys past the end of a ragged tile
      const bool expected = j < tokens && sees(i, j);
      if (policy.visible(i, j) != expected && ++wrong <= 5) {
        ADD_FAILURE() << "visible(" << i << ", " << j << ") = " << !expected;
      }
    }
    for (int j = 0; j < tokens; ++j) {  // rows past the end see nothing
      EXPECT_FALSE(policy.visible(tokens + i % 8, j));
    }
  }
  // The backward's transposed geometry: the queries that see key j are exactly the rows for
  // which visible(i, j) holds, and query_range() covers them for every block of keys.
  for (int j = 0; j < tokens + 8; ++j) {
    const fmha::cuda::neighborhood::RowWindow column = policy.column_window(j);
    for (int i = 0; i < tokens; ++i) {
      const bool expected = j < tokens && sees(i, j);
      const bool got =
          fmha::cuda::neighborhood::window_sees(grid, column, fmha::cuda::neighborhood::coords_of(grid, i));
      if (got != expected && ++wrong <= 5) {
        ADD_FAILURE() << "column_window(" << j << ") says query " << i << (got ? " sees" : " does not see")
                      << " it";
      }
    }
  }
  for (int block : {1, 7, 16, 32, 64}) {
    for (int first = 0; first < tokens; first += block) {
      const int last = first + block - 1 < tokens ? first + block - 1 : tokens - 1;
      const fmha::cuda::KeyRange range = policy.query_range(first, last);
      EXPECT_GE(range.begin, 0);
      EXPECT_LE(range.end, tokens);
      for (int j = first; j <= last; ++j) {
        for (int i = 0; i < tokens; ++i) {
          if (sees(i, j) && (i < range.begin || i >= range.end) && ++wrong <= 5) {
            ADD_FAILURE() << "keys [" << first << ", " << last << "] query range [" << range.begin
                          << ", " << range.end << ") misses query " << i << " of key " << j;
          }
        }
      }
    }
  }
  // Blocks of consecutive rows (sizes of the kernel's block_m and others) and tiles of 64 / 32 /
  // 8 keys: the range must hold every visible key; a full tile must be entirely visible.
  for (int block : {1, 5, 16, 64, 128}) {
    for (int first = 0; first < tokens; first += block) {
      const int last = first + block - 1 < tokens ? first + block - 1 : tokens - 1;
      const fmha::cuda::KeyRange range = policy.key_range(first, last);
      EXPECT_GE(range.begin, 0);
      EXPECT_LE(range.end, tokens);
      for (int i = first; i <= last; ++i) {
        for (int j = 0; j < tokens; ++j) {
          if (sees(i, j) && (j < range.begin || j >= range.end) && ++wrong <= 5) {
            ADD_FAILURE() << "rows [" << first << ", " << last << "] key range [" << range.begin
                          << ", " << range.end << ") misses key " << j << " of row " << i;
          }
        }
      }
      for (int tile : {8, 32, 64}) {
        for (int key = 0; key < tokens; key += tile) {
          if (!policy.tile_is_full(first, last, key, tile)) continue;
          for (int i = first; i <= last; ++i) {
            for (int j = key; j < key + tile; ++j) {
              if ((j >= tokens || !sees(i, j)) && ++wrong <= 5) {
                ADD_FAILURE() << "rows [" << first << ", " << last << "] tile at " << key
                              << " claimed full but row " << i << " does not see key " << j;
              }
            }
          }
        }
      }
    }
  }
}

TEST(CudaNeighborhoodMaskSmall, OneDim) {
  for (int x : {1, 7, 13, 64, 200}) {
    for (int k : {1, 2, 3, 4, 7, 8}) {
      for (int d : {1, 2, 3}) {
        for (bool causal : {false, true}) {
          if (k * d > x) continue;
          check_geometry({1, {x}, {k}, {d}, {causal}});
        }
      }
    }
  }
  check_geometry({1, {300}, {300}, {1}, {false}});  // kernel = grid: every tile full
}

TEST(CudaNeighborhoodMaskSmall, TwoDim) {
  check_geometry({2, {7, 9}, {3, 5}, {1, 1}, {false, false}});
  check_geometry({2, {7, 9}, {2, 4}, {2, 2}, {false, false}});
  check_geometry({2, {8, 7}, {3, 2}, {2, 3}, {true, false}});
  check_geometry({2, {8, 7}, {3, 3}, {1, 2}, {false, true}});
  check_geometry({2, {5, 6}, {2, 3}, {2, 1}, {true, true}});
  check_geometry({2, {17, 23}, {5, 7}, {3, 2}, {false, false}});
  check_geometry({2, {16, 16}, {16, 16}, {1, 1}, {false, false}});
  check_geometry({2, {1, 40}, {1, 6}, {1, 3}, {false, false}});
  check_geometry({2, {40, 1}, {6, 1}, {3, 1}, {false, true}});
}

TEST(CudaNeighborhoodMaskSmall, ThreeDim) {
  check_geometry({3, {4, 5, 6}, {3, 2, 3}, {1, 2, 2}, {false, false, false}});
  check_geometry({3, {5, 4, 5}, {2, 3, 2}, {2, 1, 2}, {true, false, true}});
  check_geometry({3, {3, 4, 5}, {3, 4, 5}, {1, 1, 1}, {false, false, true}});
  check_geometry({3, {6, 7, 9}, {3, 4, 2}, {2, 1, 3}, {false, true, false}});
}

}  // namespace
}  // namespace fmha_cuda_test
