#!/usr/bin/env bash
# Session 15 call 9 (ran on an H100 80GB HBM3): pytest on CUDA tensors at the final code (the package built offline
# with every bucket; calls 4 and 7 ran it at earlier steps of the change).
cd "$(dirname "$0")/../../../.."
set -u
STEPS="python" PYTEST_SECONDS=200 bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
