#!/usr/bin/env bash
# Session 20 call 7 (df3a43a + the CUDA-graph test): scripts/gpu-check.sh's python step: the
# package installed as a user would, pytest on CUDA (with the new CUDA-graph capture test).
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 STEPS="python" bash scripts/gpu-check.sh
cd "${OUT:-build-gpu}" && tar -xzf gpu-check.tgz && grep -E "graph|passed|failed|Error" gpu-check/python.log | tail -n 12
rm -rf gpu-check
