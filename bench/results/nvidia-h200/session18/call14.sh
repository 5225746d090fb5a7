#!/usr/bin/env bash
# Session 18 call 14 (the final code: the preprocess's chunk form now chosen in make_params): the
# build, the whole CUDA suite, the Python package and pytest on CUDA, and the device time by kernel
# of SAM-B (which preprocess kernel runs, and its time).
cd "$(dirname "$0")/../../../.."
set -u
STEPS="build cuda-tests python" CUDA_TESTS_SECONDS=220 PYTEST_SECONDS=120 bash scripts/gpu-check.sh
timeout 40 python3 bench/profile_kernels.py --case sam-b 2>&1 | grep -v -i warn | tee "$OUT/profile.txt"
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
