#!/usr/bin/env bash
# Session 16 call 10: the final commit (policy forms in one header, the decode host-callable; SASS
# identical on the sampled instantiations): build, the whole CUDA suite, the forward tests with
# 3 / 2 persistent blocks.
cd "$(dirname "$0")/../../../.."
set -u
STEPS="build cuda-tests persistent-tests" CUDA_TESTS_SECONDS=220 bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
