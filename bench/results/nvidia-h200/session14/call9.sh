#!/usr/bin/env bash
# Session 14 call 9 (H200): head sections of at least two heads where the heads are even (the
# GQA dK/dV kernel had none: 16 MiB of Q / dO a kv head). Build (C++ suite all buckets, Python
# package buckets 64;128;256), the whole CUDA suite, then GQA against the same query shape without
# it, and the causal cells of the dense grid, against FA2 and cuDNN, one process each.
cd "$(dirname "$0")/../../../.."
set -u
export PIP_BUCKETS="64;128;256"
STEPS="build cuda-tests bench" CUDA_TESTS_SECONDS=220 BENCH_SECONDS=150 \
  BENCH_RUNS="features|--impls fmha,sdpa-flash,sdpa-cudnn --directions fwd,bwd --cases GQA|MHA --budget-ms 10 --no-plots;standard|--impls fmha,sdpa-flash --directions fwd,bwd --cases causal.L(2048|8192)$ --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
