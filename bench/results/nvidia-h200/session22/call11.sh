#!/usr/bin/env bash
# Session 22 call 11: after the warpgroup barrier became one instruction with its id in a register
# (call 10's racecheck report: a predicated pair of barrier instructions): racecheck and memcheck
# over the Float32Sm90Planes tests on the rebuilt test binary, then the fp32 kernels' timing.
cd "$(dirname "$0")/../../../.."
set -u
export PATH=/usr/local/cuda/bin:$PATH
PACK_ONLY=1 PREBUILT=.gpu/prebuilt STEPS="build sanitizer" SANITIZER_SECONDS=150 \
  SANITIZER_FILTER="*Float32Sm90Planes*" PERSISTENT_RACECHECK_FILTER="CudaForward.Float32Sm90Planes" \
  bash scripts/gpu-check.sh
mkdir -p .gpu/s22/bin
nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
  -o .gpu/s22/bin/fp32 bench/cpp/sm90_fp32_timing.cu src/cuda/workspace_pool.cu -lcuda
.gpu/s22/bin/fp32 | grep -v "^check"
