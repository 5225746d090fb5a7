// The CUDA neighborhood mask policy (src/cuda/common/neighborhood_mask.cuh) checked on the host,
// no GPU needed, against the SPEC §6 mask of the naive oracle (tests/naive), which is written from
// the formula. Token tiles (forward and, transposed, the backward's dK/dV kernel): every token is
// a row of one block, a block's boxes hold each token its rows see once, the group-major window
// test equals the mask, boxes claimed full are. Flattened order (the backward's dQ kernel):
// visible() equals the mask, key_range() covers every key of a block of consecutive tokens.
#include <cuda_runtime.h>  // defines __host__ / __device__ for the host compiler
#include <gtest/gtest.h>

#include <array>
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

// The launchers' shapes found once on the host (set_box_shapes) give a block the same tiles as
// block_tiles' own search.
void expect_same_tiles(const fmha::cuda::neighborhood::BlockTiles& searched,
                       const fmha::cuda::neighborhood::BlockTiles& preset, int block) {
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(searched.box_shape[r], preset.box_shape[r]) << "block " << block << " axis " << r;
    EXPECT_EQ(searched.box_origin[r], preset.box_origin[r]) << "block " << block << " axis " << r;
    EXPECT_EQ(searched.seen_shape[r], preset.seen_shape[r]) << "block " << block << " axis " << r;
    EXPECT_EQ(searched.seen_origin[r], preset.seen_origin[r]) << "block " << block << " axis " << r;
    EXPECT_EQ(searched.seen_tiles[r], preset.seen_tiles[r]) << "block " << block << " axis " << r;
    EXPECT_EQ(searched.full_lo[r], preset.full_lo[r]) << "block " << block << " axis " << r;
    EXPECT_EQ(searched.full_hi[r], preset.full_hi[r]) << "block " << block << " axis " << r;
  }
  EXPECT_EQ(searched.num_seen_tiles, preset.num_seen_tiles) << "block " << block;
}

// The sm90 kernels' bit-mask test (neighborhood_mask.cuh, visible_columns) for boxes of the seen
// shape of `preset` (a grid through set_box_shapes for `columns` columns): whether column c of the
// box at `origin` lies in `window`, read from the launcher's table of c's lane quad as the kernels
// read their copy of it (bit 2t + e for column 2 * quad + e + 8t).
class ColumnBitTest {
 public:
  ColumnBitTest(const fmha::cuda::NeighborhoodGrid& preset, int columns)
      : shape_{preset.seen_shape[0], preset.seen_shape[1], preset.seen_shape[2]} {
    namespace nb = fmha::cuda::neighborhood;
    EXPECT_EQ(preset.column_tiles, columns / 8);
    for (int quad = 0; quad < 4; ++quad) {
      for (int e = 0; e < nb::prefix_entries(shape_); ++e) {
        prefix_[quad].push_back(preset.column_bits[quad][e]);
      }
    }
  }
  bool operator()(const int (&origin)[3], const fmha::cuda::neighborhood::AxisWindow (&window)[3],
                  int c) const {
    const int quad = (c % 8) / 2, bit = 2 * (c / 8) + c % 2;
    const unsigned seen =
        fmha::cuda::neighborhood::visible_columns(prefix_[quad].data(), shape_, origin, window);
    return (seen >> bit) & 1u;
  }

 private:
  int shape_[3];
  std::vector<unsigned> prefix_[4];
};

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
  // Multi-dimensional token tiles (the forward): every token is a query row of exactly one block;
  // a block's key boxes hold every key its rows see, each once; the group-major window test
  // equals visibility; a box claimed full is seen whole by every row.
  namespace nb = fmha::cuda::neighborhood;
  for (int rows : {64, 128}) {
    for (int keys : {32, 64, 128}) {
      std::vector<int> owner(static_cast<std::size_t>(tokens), 0);
      const int blocks = nb::num_block_boxes(grid, rows);
      fmha::cuda::NeighborhoodGrid preset = grid;
      nb::set_box_shapes(preset, rows, keys);
      for (int block = 0; block < blocks; ++block) {
        const nb::BlockTiles bt = nb::block_tiles(grid, block, rows, keys);
        expect_same_tiles(bt, nb::block_tiles(preset, block, rows, keys), block);
        std::vector<int> key_seen(static_cast<std::size_t>(tokens), 0);
        std::vector<std::array<int, 3>> key_pos(static_cast<std::size_t>(tokens));
        for (int u = 0; u < bt.num_seen_tiles; ++u) {
          int origin[3];
          nb::seen_box_origin(bt, u, origin);
          for (int c = 0; c < keys; ++c) {
            int yp[3];
            const int j = nb::box_token(grid, bt.seen_shape, origin, c, yp);
            if (j < 0) continue;
            ++key_seen[static_cast<std::size_t>(j)];
            key_pos[static_cast<std::size_t>(j)] = {yp[0], yp[1], yp[2]};
          }
        }
        for (int j = 0; j < tokens; ++j) {
          if (key_seen[static_cast<std::size_t>(j)] > 1 && ++wrong <= 5) {
            ADD_FAILURE() << "block " << block << " holds key " << j << " twice";
          }
        }
        for (int r = 0; r < rows; ++r) {
          int yp[3];
          const int i = nb::box_token(grid, bt.box_shape, bt.box_origin, r, yp);
          if (i < 0) continue;
          ++owner[static_cast<std::size_t>(i)];
          for (int j = 0; j < tokens; ++j) {
            const auto& kp = key_pos[static_cast<std::size_t>(j)];
            bool test = key_seen[static_cast<std::size_t>(j)] > 0;
            for (int a = 0; a < 3; ++a) {
              const nb::AxisWindow w = nb::group_major_window(grid, a, yp[a]);
              test = test && kp[a] >= w.lo && kp[a] <= w.hi;
            }
            if (test != sees(i, j) && ++wrong <= 5) {
              ADD_FAILURE() << "block " << block << " row " << i << " key " << j
                            << (key_seen[static_cast<std::size_t>(j)] ? "" : " (not in a key box)")
                            << ": tiled test " << test << ", mask " << sees(i, j);
            }
          }
        }
        // The bit-mask test of every row against every key box equals the mask.
        const ColumnBitTest column_bit(preset, keys);
        for (int u = 0; u < bt.num_seen_tiles; ++u) {
          int origin[3];
          nb::seen_box_origin(bt, u, origin);
          for (int r = 0; r < rows; ++r) {
            nb::AxisWindow w[3];
            const int i = nb::own_box_entry(grid, bt, r, /*transposed=*/false, w);
            for (int c = 0; c < keys; ++c) {
              int yk[3];
              const int j = nb::box_token(grid, bt.seen_shape, origin, c, yk);
              const bool expected = i >= 0 && j >= 0 && sees(i, j);
              if (column_bit(origin, w, c) != expected && ++wrong <= 5) {
                ADD_FAILURE() << "block " << block << " key box " << u << " row " << r << " column "
                              << c << ": bit test " << !expected << ", mask " << expected;
              }
            }
          }
        }
        for (int u = 0; u < bt.num_seen_tiles; ++u) {
          if (!nb::seen_box_is_full(grid, bt, u, keys)) continue;
          int origin[3];
          nb::seen_box_origin(bt, u, origin);
          for (int r = 0; r < rows; ++r) {
            int yq[3];
            const int i = nb::box_token(grid, bt.box_shape, bt.box_origin, r, yq);
            if (i < 0) continue;  // rows past the box: computed, never stored
            for (int c = 0; c < keys; ++c) {
              int yk[3];
              const int j = nb::box_token(grid, bt.seen_shape, origin, c, yk);
              if (c >= bt.seen_shape[0] * bt.seen_shape[1] * bt.seen_shape[2]) continue;
              if ((i < 0 || j < 0 || !sees(i, j)) && ++wrong <= 5) {
                ADD_FAILURE() << "block " << block << " key box " << u << " claimed full but row "
                              << i << " / key " << j << " fails";
              }
            }
          }
        }
      }
      for (int i = 0; i < tokens; ++i) {
        if (owner[static_cast<std::size_t>(i)] != 1 && ++wrong <= 5) {
          ADD_FAILURE() << "token " << i << " is a query row of "
                        << owner[static_cast<std::size_t>(i)] << " blocks (rows " << rows << ")";
        }
      }
    }
  }
  // Transposed (the backward's dK/dV kernel): every token is a key of one block; a block's query
  // boxes hold every query that sees one of its keys, each once; the transposed window test equals
  // the mask; a box claimed full is seen whole.
  for (int keys : {64}) {
    for (int rows : {16, 32, 64}) {
      std::vector<int> owner(static_cast<std::size_t>(tokens), 0);
      const int blocks = nb::num_block_boxes(grid, keys);
      fmha::cuda::NeighborhoodGrid preset = grid;
      nb::set_box_shapes(preset, keys, rows);
      for (int block = 0; block < blocks; ++block) {
        const nb::BlockTiles bt = nb::block_tiles(grid, block, keys, rows, /*transposed=*/true);
        expect_same_tiles(bt, nb::block_tiles(preset, block, keys, rows, /*transposed=*/true),
                          block);
        const ColumnBitTest column_bit(preset, rows);
        std::vector<int> query_seen(static_cast<std::size_t>(tokens), 0);
        std::vector<std::array<int, 3>> query_pos(static_cast<std::size_t>(tokens));
        for (int u = 0; u < bt.num_seen_tiles; ++u) {
          int origin[3];
          nb::seen_box_origin(bt, u, origin);
          for (int c = 0; c < rows; ++c) {
            int yp[3];
            const int i = nb::box_token(grid, bt.seen_shape, origin, c, yp);
            if (i < 0) continue;
            ++query_seen[static_cast<std::size_t>(i)];
            query_pos[static_cast<std::size_t>(i)] = {yp[0], yp[1], yp[2]};
          }
          // The kernel's byte test: the key's transposed window clipped to this query box.
          for (int kr = 0; kr < keys; ++kr) {
            int yk[3];
            const int j = nb::box_token(grid, bt.box_shape, bt.box_origin, kr, yk);
            if (j < 0) continue;
            nb::AxisWindow w[3];
            for (int a = 0; a < 3; ++a) w[a] = nb::group_major_window(grid, a, yk[a], true);
            unsigned lo = 0, hi = 0;
            nb::box_bounds_bytes(w, origin, bt.seen_shape, &lo, &hi);
            for (int c = 0; c < rows; ++c) {
              int yq[3];
              const int i = nb::box_token(grid, bt.seen_shape, origin, c, yq);
              if (i < 0) continue;
              const bool test = nb::bytes_within(nb::box_local_bytes(bt.seen_shape, c), lo, hi);
              if (test != sees(i, j) && ++wrong <= 5) {
                ADD_FAILURE() << "key block " << block << " query box " << u << " key " << j
                              << " query " << i << ": byte test " << test << ", mask "
                              << sees(i, j);
              }
              const bool bit = column_bit(origin, w, c);
              if (bit != sees(i, j) && ++wrong <= 5) {
                ADD_FAILURE() << "key block " << block << " query box " << u << " key " << j
                              << " query " << i << ": bit test " << bit << ", mask " << sees(i, j);
              }
            }
          }
          const bool full = nb::seen_box_is_full(grid, bt, u, rows, /*transposed=*/true);
          for (int kr = 0; full && kr < keys; ++kr) {
            int yk[3];
            const int j = nb::box_token(grid, bt.box_shape, bt.box_origin, kr, yk);
            if (j < 0) continue;
            for (int c = 0; c < rows; ++c) {
              int yq[3];
              const int i = nb::box_token(grid, bt.seen_shape, origin, c, yq);
              if ((i < 0 || !sees(i, j)) && ++wrong <= 5) {
                ADD_FAILURE() << "key block " << block << " query box " << u
                              << " claimed full but query " << i << " / key " << j << " fails";
              }
            }
          }
        }
        for (int i = 0; i < tokens; ++i) {
          if (query_seen[static_cast<std::size_t>(i)] > 1 && ++wrong <= 5) {
            ADD_FAILURE() << "key block " << block << " holds query " << i << " twice";
          }
        }
        for (int kr = 0; kr < keys; ++kr) {
          int yk[3];
          const int j = nb::box_token(grid, bt.box_shape, bt.box_origin, kr, yk);
          if (j < 0) continue;
          ++owner[static_cast<std::size_t>(j)];
          for (int i = 0; i < tokens; ++i) {
            const auto& qp = query_pos[static_cast<std::size_t>(i)];
            bool test = query_seen[static_cast<std::size_t>(i)] > 0;
            for (int a = 0; a < 3; ++a) {
              const nb::AxisWindow w = nb::group_major_window(grid, a, yk[a], /*transposed=*/true);
              test = test && qp[a] >= w.lo && qp[a] <= w.hi;
            }
            if (test != sees(i, j) && ++wrong <= 5) {
              ADD_FAILURE() << "key block " << block << " key " << j << " query " << i
                            << (query_seen[static_cast<std::size_t>(i)] ? "" : " (not in a box)")
                            << ": transposed test " << test << ", mask " << sees(i, j);
            }
          }
        }
      }
      for (int j = 0; j < tokens; ++j) {
        if (owner[static_cast<std::size_t>(j)] != 1 && ++wrong <= 5) {
          ADD_FAILURE() << "token " << j << " is a key of " << owner[static_cast<std::size_t>(j)]
                        << " blocks";
        }
      }
    }
  }
  // Blocks of consecutive rows (the backward's dQ kernel): the range must hold every visible key.
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
  // Dilated windows wider than a block: boxes of one group claimed full (not on holes).
  check_geometry({1, {1000}, {300}, {3}, {false}});
  check_geometry({1, {1001}, {250}, {4}, {true}});
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
  check_geometry({2, {64, 41}, {20, 17}, {2, 2}, {false, false}});  // dilated full boxes
}

TEST(CudaNeighborhoodMaskSmall, ThreeDim) {
  check_geometry({3, {4, 5, 6}, {3, 2, 3}, {1, 2, 2}, {false, false, false}});
  check_geometry({3, {5, 4, 5}, {2, 3, 2}, {2, 1, 2}, {true, false, true}});
  check_geometry({3, {3, 4, 5}, {3, 4, 5}, {1, 1, 1}, {false, false, true}});
  check_geometry({3, {6, 7, 9}, {3, 4, 2}, {2, 1, 3}, {false, true, false}});
}

}  // namespace
}  // namespace fmha_cuda_test
