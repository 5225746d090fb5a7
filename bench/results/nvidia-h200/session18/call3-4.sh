#!/usr/bin/env bash
# Session 18 calls 3 and 4: bench/cpp/sm80_fp32_timing.cu built on the development machine for
# sm_90a (the build line in its header) as .gpu/fp32-main (a18ae65's kernels), .gpu/fp32-fresh and
# .gpu/fp32-pairs (the working tree at each step), carried to the device with .gpu.
cd .gpu && for i in 1 2; do timeout 60 ./fp32-main; timeout 60 ./fp32-fresh; timeout 60 ./fp32-pairs; done
