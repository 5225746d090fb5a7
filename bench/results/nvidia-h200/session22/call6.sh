#!/usr/bin/env bash
# Session 22 call 6: the sm90 fp32 kernels with the warpgroup index read from lane 0 (wgmma
# descriptors in uniform registers), copies by address increments and one planes pass an input:
# bench/cpp/sm90_fp32_timing.cu (checks, the forward, the backward by part), kernel only.
cd "$(dirname "$0")/../../../.."
set -u
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p .gpu/s22/bin
nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
  -o .gpu/s22/bin/fp32 bench/cpp/sm90_fp32_timing.cu src/cuda/workspace_pool.cu -lcuda
.gpu/s22/bin/fp32
