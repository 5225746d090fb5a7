#!/usr/bin/env bash
# Session 12 call 5: main at 383b47b: the Python tests on CUDA tensors, and the dense forward and
# backward (D 64 / 128, L 512 / 2048 / 8192, causal and not) against FA2 / cuDNN in one process.
cd "$(dirname "$0")/.."
export STEPS="python bench" BENCH_SECONDS=250 PYTEST_SECONDS=200
export BENCH_RUNS='standard|--cases ^D(64|128)(.causal)?.L(512|2048|8192)$ --impls fmha,sdpa-flash,sdpa-cudnn --directions fwd,bwd --budget-ms 8 --no-plots'
bash scripts/gpu-check.sh
