#!/usr/bin/env bash
# Session 17 call 5 (078d3de; call 4 lost: the machine stopped answering): the GPU suite on the
# session's final kernels: the build, the whole CUDA suite, the forward on
# the cp.async path and with persistent blocks, memcheck and racecheck (gpu-check's default
# filters; the persistent racecheck pass now takes BiasStagedTiles). The sm80 kernels did not
# change this session (their tests: session 16 call 8).
cd "$(dirname "$0")/../../../.."
set -u
STEPS="build cuda-tests cp-async-tests persistent-tests sanitizer" \
  CUDA_TESTS_SECONDS=240 SANITIZER_SECONDS=150 bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
