#!/usr/bin/env bash
# Session 11 call 2: whole CUDA suite after the fused kernel's dS^T moved into the staged bias tile
# (D 64), then fused vs split with a bias (SAM-B [1, H, L, L] D 64; B2 H16 L2048 D128) against cuDNN.
cd "$(dirname "$0")/.."
export PREBUILT=.gpu/prebuilt STEPS="build cuda-tests bench" PIP_BUCKETS="64;128" BENCH_SECONDS=300
export BENCH_RUNS='features|--cases ^bias --impls fmha,sdpa-cudnn --directions bwd --backward-impl both --budget-ms 8 --no-plots'
bash scripts/gpu-check.sh
