#!/usr/bin/env bash
# Session 17 call 4 (078d3de): the GPU suite on the session's final kernels: the build, the whole
# CUDA suite, the sm80 kernels' tests, the forward on the cp.async path.
cd "$(dirname "$0")/../../../.."
set -u
STEPS="build cuda-tests sm80-tests cp-async-tests" CUDA_TESTS_SECONDS=240 bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
