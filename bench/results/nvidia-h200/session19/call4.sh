#!/usr/bin/env bash
# Session 19 call 4: bench/cpp/sm90_backward_timing.cu on main's kernels (`main`), on call 3's
# `pp`, and on `pp4`, an experiment built from a patched copy of the tree: the dK/dV kernel in
# ping-pong with four stages and its loads two steps ahead, also at D 128 and under the bias (the
# bias with 64-query steps so that four stages of Q, dO and bias tiles fit), alternated twice.
cd .gpu/s19 && for i in 1 2; do for v in main pp pp4; do timeout 90 ./$v; done; done
nvidia-smi --query-gpu=name --format=csv,noheader
