#!/usr/bin/env bash
# Session 21 call 7 (18300c6, the final kernel code): scripts/gpu-check.sh's Python steps: the
# package installed as a user would, pytest on CUDA, and issue 4's cells in one process each: the
# dense grid (D 64 / 128 / 256, L 512 / 2048 / 8192, causal and not) forward and backward against
# FA2; fp32 against the efficient backend; GQA against the same query shape without it (and FA2);
# the [1, H, L, L] bias forward and backward against cuDNN.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 STEPS="python bench" BENCH_SECONDS=240 \
  BENCH_RUNS="standard|--impls fmha,sdpa-flash --directions fwd,bwd --budget-ms 8 --no-plots;features|--impls fmha,sdpa-efficient --directions fwd,bwd --cases ^fp32 --budget-ms 8 --no-plots;features|--impls fmha,sdpa-flash --directions fwd,bwd --cases ^(GQA|MHA) --budget-ms 8 --no-plots;features|--impls fmha,sdpa-cudnn --directions fwd,bwd --cases ^bias.\[1 --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
