#!/usr/bin/env bash
# Session 16 call 9: issue 4's GQA cell after the persistent forward (H32 / Hkv8 D 128 L 8192 causal
# against the same query shape with H = Hkv, forward and backward, one process), and the memory
# suite's peak extra memory (the forward now takes a 4-byte tile counter under causal masks).
cd "$(dirname "$0")/../../../.."
set -u
export PIP_BUCKETS="128"
STEPS="bench" BENCH_SECONDS=200 \
  BENCH_RUNS="features|--impls fmha,sdpa-flash --directions fwd,bwd --cases GQA.H32|MHA.H32 --budget-ms 8 --no-plots;memory|--impls fmha,sdpa-flash --cases D128 --no-plots" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
