#!/usr/bin/env bash
# Session 14 call 6 (H200): main with head sections under causal masks only, the new
# CausalHeadSections test and the merged neighborhood host clean-ups. Build (C++ suite all
# buckets, Python package buckets 64;128;256), the whole CUDA suite, then in one process each:
# issue 4's dense grid against FA2 and cuDNN, and issue 5's neighborhood cases against compiled Flex.
cd "$(dirname "$0")/../../../.."
set -u
export PIP_BUCKETS="64;128;256"
STEPS="build cuda-tests bench" CUDA_TESTS_SECONDS=220 BENCH_SECONDS=240 \
  BENCH_RUNS="standard|--impls fmha,sdpa-flash,sdpa-cudnn --directions fwd,bwd --cases D(64|128|256)(.causal)?.L(512|2048|8192)$ --budget-ms 8 --no-plots;na|--impls fmha,flex --directions fwd,bwd --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
