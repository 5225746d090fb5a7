#!/usr/bin/env bash
# Session 19 call 1: bench/cpp/sm90_backward_timing.cu on main's sm90 kernels (19a9099, `main`),
# the dQ kernel with ping-pong (`pp1`: 128-key tiles) and the same with 64-key tiles (`pp-n64`),
# all built on the development machine, alternated twice.
cd .gpu/s19 && for i in 1 2; do for v in main pp1 pp-n64; do timeout 60 ./$v; done; done
nvidia-smi --query-gpu=name --format=csv,noheader
