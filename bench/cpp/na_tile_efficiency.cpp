// fmha-na-tiles: how much of the work of the neighborhood kernels' token tiles is useful, computed
// on the host from the kernels' own tiling (src/cuda/common/neighborhood_mask.cuh), no GPU needed.
// For each grid and each (query rows, keys) tile size: the query box and key box shapes, blocks per
// (batch, head), key tiles per block, and the visible pairs over the computed ones (every key tile
// is a full tile of products). Grids with one axis of more than one token and no dilation do not
// run on token tiles (the dense kernels' window, set_neighborhood_mask): their rows here show what
// the token tiles would do. Issue 5's cases by default; or one grid from the command line:
//   fmha-na-tiles                      # the bench suite's NA cases
//   fmha-na-tiles 64,64 13,13 1,1      # sizes, kernel sizes, dilations (comma-separated per axis)
#include <cuda_runtime.h>  // defines __host__ / __device__ for the host compiler

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/common/neighborhood_mask.cuh"

namespace {

using fmha::cuda::NeighborhoodGrid;
namespace nb = fmha::cuda::neighborhood;

struct Case {
  std::string name;
  NeighborhoodGrid grid;
};

NeighborhoodGrid make_grid(const std::vector<int>& size, const std::vector<int>& kernel,
                           const std::vector<int>& dilation) {
  NeighborhoodGrid g;
  g.rank = static_cast<int>(size.size());
  for (int r = 0; r < g.rank; ++r) {
    g.size[r] = size[r];
    g.kernel[r] = kernel[r];
    g.dilation[r] = dilation[r];
  }
  return g;
}

std::vector<int> parse_axes(const char* text) {
  std::vector<int> axes;
  for (const char* p = text; *p != '\0';) {
    axes.push_back(std::atoi(p));
    p = std::strchr(p, ',');
    if (p == nullptr) break;
    ++p;
  }
  return axes;
}

// Visible pairs of the grid: every query sees prod_r K_r keys (non-causal axes).
double visible_pairs(const NeighborhoodGrid& g) {
  double tokens = 1, keys = 1;
  for (int r = 0; r < 3; ++r) {
    tokens *= g.size[r];
    keys *= g.kernel[r];
  }
  return tokens * keys;
}

void report(const Case& c) {
  std::printf("%s\n", c.name.c_str());
  for (int rows : {64, 128}) {
    for (int keys : {64, 128}) {
      const int blocks = nb::num_block_boxes(c.grid, rows);
      double computed = 0, tiles = 0;
      for (int b = 0; b < blocks; ++b) {
        const nb::BlockTiles t = nb::block_tiles(c.grid, b, rows, keys);
        computed += static_cast<double>(rows) * t.num_seen_tiles * keys;
        tiles += t.num_seen_tiles;
      }
      const nb::BlockTiles t0 = nb::block_tiles(c.grid, 0, rows, keys);
      std::printf(
          "  rows %3d keys %3d: query box %dx%dx%d, key box %dx%dx%d, %6d blocks, %5.1f key tiles "
          "a block, useful pairs %5.1f%%\n",
          rows, keys, t0.box_shape[0], t0.box_shape[1], t0.box_shape[2], t0.seen_shape[0],
          t0.seen_shape[1], t0.seen_shape[2], blocks, tiles / blocks,
          100.0 * visible_pairs(c.grid) / computed);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Case> cases;
  if (argc == 4) {
    const std::vector<int> size = parse_axes(argv[1]), kernel = parse_axes(argv[2]),
                           dilation = parse_axes(argv[3]);
    if (size.empty() || size.size() > 3 || kernel.size() != size.size() ||
        dilation.size() != size.size()) {
      std::fprintf(stderr, "usage: %s SIZES KERNELS DILATIONS (e.g. 64,64 13,13 1,1)\n", argv[0]);
      return 2;
    }
    cases.push_back({std::string("grid ") + argv[1] + " K " + argv[2] + " dilation " + argv[3],
                     make_grid(size, kernel, dilation)});
  } else if (argc == 1) {
    cases = {{"NA1d L32768 K2047", make_grid({32768}, {2047}, {1})},
             {"NA1d L32768 K2047 dil4", make_grid({32768}, {2047}, {4})},
             {"NA2d 64x64 K13x13", make_grid({64, 64}, {13, 13}, {1, 1})},
             {"NA2d 128x128 K7x7 dil2", make_grid({128, 128}, {7, 7}, {2, 2})},
             {"NA3d 16x32x32 K7x7x7", make_grid({16, 32, 32}, {7, 7, 7}, {1, 1, 1})}};
  } else {
    std::fprintf(stderr, "usage: %s [SIZES KERNELS DILATIONS]\n", argv[0]);
    return 2;
  }
  for (const Case& c : cases) report(c);
  return 0;
}
