#!/usr/bin/env bash
# Session 11 call 1: whole CUDA suite on the prebuilt binary (fused sm90 backward at D 64 / 128 with
# bulk reductions at both), then fused vs split backward against FA2 / cuDNN in one process.
cd "$(dirname "$0")/.."
export PREBUILT=.gpu/prebuilt STEPS="build cuda-tests bench" PIP_BUCKETS="64;128" BENCH_SECONDS=330
export BENCH_RUNS='standard|--cases ^D(64|128)(.causal)?.L(512|2048|8192)$ --impls fmha,sdpa-flash,sdpa-cudnn --directions bwd --backward-impl both --budget-ms 8 --no-plots;features|--cases ^(no-)?bias.*SAM-B --impls fmha,sdpa-cudnn --directions bwd --backward-impl both --budget-ms 8 --no-plots'
bash scripts/gpu-check.sh
