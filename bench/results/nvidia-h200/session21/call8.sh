#!/usr/bin/env bash
# Session 21 call 8 (18300c6's library): the package installed as a user would and pytest on CUDA
# (scripts/gpu-check.sh's python step), then bench/host_overhead.py: the host time of one call at a
# shape whose kernels are short, by layer of fmha, against SDPA's flash backend.
cd "$(dirname "$0")/../../../.."
set -u
PACK_ONLY=1 STEPS="python" bash scripts/gpu-check.sh
python3 bench/host_overhead.py
