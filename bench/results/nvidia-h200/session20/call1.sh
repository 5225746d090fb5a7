#!/usr/bin/env bash
# Session 20 call 1: bench/cpp/sm90_backward_timing.cu on main's kernels (5756ed2, `main`) and on
# 3e10bf8's (`new`: the dQ kernel overlapping the dK/dV kernel), alternated twice. `new` also times
# each case's kernel pair one after the other and overlapped (FMHA's split backward order).
cd "$(dirname "$0")/../../../.."
set -uf
nvidia-smi --query-gpu=name --format=csv,noheader
(cd .gpu/s20 && for i in 1 2; do for v in main new; do timeout 90 ./$v; done; done)
