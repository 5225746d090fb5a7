#!/usr/bin/env bash
# Session 19 call 5 (fef9e7f, the backward ping-pong: the dQ kernel up to D 128, the dK/dV kernel up
# to D 64 without bias): the CUDA suite on the test binary built on the development machine
# (scripts/build-gpu-tests.sh, carried in .gpu/prebuilt), the Python package and pytest on CUDA,
# then the SAM-B backward against cuDNN with and without the [1, H, L, L] bias, and the dense D 64 /
# 128 backward against FlashAttention-2 and cuDNN, one process each.
cd "$(dirname "$0")/../../../.."
set -u
PREBUILT=.gpu/prebuilt STEPS="build cuda-tests python bench" CUDA_TESTS_SECONDS=220 \
  PYTEST_SECONDS=150 BENCH_SECONDS=150 \
  BENCH_RUNS="features|--impls fmha,sdpa-cudnn --directions bwd --cases SAM-B --budget-ms 8 --no-plots;standard|--impls fmha,sdpa-flash,sdpa-cudnn --directions bwd --cases D(64|128)(.causal)?.L(512|2048|8192)$ --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
