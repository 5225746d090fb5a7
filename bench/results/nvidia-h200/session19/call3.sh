#!/usr/bin/env bash
# Session 19 call 3: bench/cpp/sm90_backward_timing.cu (now also D 128 plain at B 2, H 16, L 8192)
# on main's kernels (19a9099, `main`) and on both backward kernels with ping-pong (`pp`: the dQ
# kernel as call 2's pp-nd, the dK/dV kernel the same way), built on the development machine,
# alternated three times.
cd .gpu/s19 && for i in 1 2 3; do for v in main pp; do timeout 90 ./$v; done; done
nvidia-smi --query-gpu=name --format=csv,noheader
