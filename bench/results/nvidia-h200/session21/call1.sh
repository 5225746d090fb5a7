#!/usr/bin/env bash
# Session 21 call 1: bench/cpp/sm90_backward_timing.cu built here (nvcc, sm_90a) on main's kernels
# (d17cb34, `main`: the tool with its new digests) and on the working tree's (`tma`: the dQ
# kernel's K / V tiles, and the bias policy's tiles, by TMA from thread 0, every range-tile policy
# but the general one), alternated twice; carried in .gpu/s21.
cd "$(dirname "$0")/../../../.."
set -uf
nvidia-smi --query-gpu=name --format=csv,noheader
cd .gpu/s21 && for i in 1 2; do for v in main tma; do timeout 100 ./$v; done; done
