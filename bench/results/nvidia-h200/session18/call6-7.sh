#!/usr/bin/env bash
# Session 18 calls 6 and 7: bench/cpp/sm80_fp32_timing.cu variants built on the development
# machine for sm_90a (.gpu/fp32-<variant>, carried), alternated twice.
cd .gpu && for i in 1 2; do timeout 60 ./fp32-presplit; timeout 60 ./fp32-tilepv; timeout 60 ./fp32-fwdsplit; done  # call 6
cd .gpu && for i in 1 2; do timeout 60 ./fp32-tilepv; timeout 60 ./fp32-ownsplit; done  # call 7
