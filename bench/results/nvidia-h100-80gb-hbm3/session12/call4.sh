#!/usr/bin/env bash
# Session 12 call 4: main at 383b47b (the fused backward's dS^T rule in one place), built on the device:
# the whole CUDA suite and compute-sanitizer (memcheck, racecheck) on the small subset + the fused tests.
cd "$(dirname "$0")/.."
export STEPS="build cuda-tests sanitizer" \
  SANITIZER_FILTER="*Small*:*HeadDimsNotMultipleOf8*:*Varlen*:*WideHeads*:*FusedAtBuckets64And128*"
bash scripts/gpu-check.sh
