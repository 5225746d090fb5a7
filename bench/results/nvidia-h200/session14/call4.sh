#!/usr/bin/env bash
# Session 14 call 4 (H200): main after the head sections and the merged neighborhood host
# clean-ups. Build (C++ suite all buckets, Python package buckets 64;96;128;256), the whole CUDA
# suite, then in one process each: issue 4's dense grid (D 64 / 128 / 256, L 512 / 2048 / 8192,
# causal and not) against FA2 and cuDNN, and the SAM shapes against cuDNN, the efficient backend
# and compiled Flex.
cd "$(dirname "$0")/../../../.."
set -u
export PIP_BUCKETS="64;96;128;256"
STEPS="build cuda-tests bench" CUDA_TESTS_SECONDS=200 BENCH_SECONDS=200 \
  BENCH_RUNS="standard|--impls fmha,sdpa-flash,sdpa-cudnn --directions fwd,bwd --cases D(64|128|256)(.causal)?.L(512|2048|8192)$ --budget-ms 8 --no-plots;features|--impls fmha,sdpa-cudnn,sdpa-efficient,flex --directions fwd,bwd --cases SAM --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
