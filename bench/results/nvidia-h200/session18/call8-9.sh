#!/usr/bin/env bash
# Session 18 calls 8 and 9 (binaries built on the development machine, carried in .gpu).
cd .gpu/s17 && timeout 60 ./new_bwd; timeout 60 ./new_bwd  # call 8
cd .gpu && for i in 1 2; do timeout 60 ./fp32-tilepv; timeout 60 ./fp32-qsplit; done  # call 9
