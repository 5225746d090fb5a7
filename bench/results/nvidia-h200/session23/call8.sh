#!/usr/bin/env bash
# Session 23 call 8: Nsight Compute at the final kernels on the 2-D K13 D 64 neighborhood case
# (bench/profile_kernels.py na2d-k13): the forward (with its copy warpgroup now) and the backward's
# dK/dV kernel, for the next step's reading (scripts/ncu_summary.py's table).
cd "$(dirname "$0")/../../../.."
set -u
BACKWARD=1 PACK_ONLY=1 PIP_BUCKETS="64" STEPS="ncu" \
  NCU_CASES="na2d-k13:forward_kernel na2d-k13:backward_dkdv" bash scripts/gpu-check.sh
