#!/usr/bin/env bash
# Session 18 call 13: bench/cpp/sm90_backward_timing.cu, main's sm90 kernels (session 17's build,
# .gpu/s17/new_bwd) and the deferred-dQ variant (.gpu/bwd-deferred, built on the development
# machine), alternated twice.
cd .gpu && for i in 1 2; do timeout 40 ./s17/new_bwd; timeout 40 ./bwd-deferred; done
