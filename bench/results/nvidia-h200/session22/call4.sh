#!/usr/bin/env bash
# Session 22 call 4: the first run of the sm90 fp32 backward (dK/dV and dQ kernels on split planes):
# bench/cpp/sm90_fp32_timing.cu's checks against float64 on small odd shapes (forward and backward), then
# issue 4's fp32 case, kernel only (the forward against the sm80 fp32 forward).
cd "$(dirname "$0")/../../../.."
set -u
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p .gpu/s22/bin
nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
  -o .gpu/s22/bin/fp32 bench/cpp/sm90_fp32_timing.cu src/cuda/workspace_pool.cu -lcuda
.gpu/s22/bin/fp32
