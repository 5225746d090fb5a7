#!/usr/bin/env bash
# Session 19 call 2: bench/cpp/sm90_backward_timing.cu on main's kernels (`main`), the dQ kernel's
# ping-pong with tile u - 1's dQ product in phase u (`pp1`, as call 1) and with each tile's dQ
# product right after its own softmax (`pp-nd`, -DFMHA_EXP_PP_ND: no spill under the bias), all
# built on the development machine, alternated twice.
cd .gpu/s19 && for i in 1 2; do for v in main pp1 pp-nd; do timeout 60 ./$v; done; done
nvidia-smi --query-gpu=name --format=csv,noheader
