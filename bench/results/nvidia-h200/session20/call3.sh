#!/usr/bin/env bash
# Session 20 call 3: the timing tool on 3e10bf8 (`new`) and two variants of the dK/dV kernel's
# query steps at D 64, built from 3e10bf8 with tile_sizes_bwd.h edited: 64-query steps instead of 96
# (`v64`), and 64-query steps over four stages instead of three (`v64s4`; kBwdStages also gives the
# dQ kernel four stages, so its numbers there are not comparable). Alternated twice.
cd "$(dirname "$0")/../../../.."
set -uf
nvidia-smi --query-gpu=name --format=csv,noheader
(cd .gpu/s20 && for i in 1 2; do for v in new v64 v64s4; do timeout 90 ./$v; done; done)
