#!/usr/bin/env bash
# Session 18 call 12: the mma.sync rates (bench/cpp/mma_sync_peak.cu, built on the development
# machine, carried in .gpu).
cd .gpu && timeout 60 ./mma-sync-peak && nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
