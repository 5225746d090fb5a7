#!/usr/bin/env bash
# Session 14 call 3 (H200): the sm90 kernels' blocks start in head sections (block_coords.cuh:
# the tiles of 2^k heads interleaved, so that under a causal mask the heaviest blocks of the last
# heads do not start last). Build (C++ suite all buckets, Python package buckets 64;128;256), the
# whole CUDA suite, then the causal cells of the dense grid against FA2 and cuDNN in one process,
# and the D 256 causal backward's device time by kernel.
cd "$(dirname "$0")/../../../.."
set -u
export PIP_BUCKETS="64;128;256"
STEPS="build cuda-tests bench" CUDA_TESTS_SECONDS=200 BENCH_SECONDS=240 \
  BENCH_RUNS="standard|--impls fmha,sdpa-flash,sdpa-cudnn --directions fwd,bwd --cases D(64|128|256).causal.L(512|2048|8192)$ --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
timeout 40 python3 bench/profile_kernels.py --case dense-d256-causal 2>&1 | grep -v Warn | tee -a "$OUT/gpu-check/profile.log"
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
