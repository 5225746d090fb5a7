#!/usr/bin/env bash
# Session 21 call 3: `tma3` = 3de079f's kernels (TMA only in the bias policy's kernels: the dQ
# kernel's K / V / bias tiles as `tma`, and the dK/dV kernel's bias tiles) against main, alternated
# twice; then both builds' digests.
cd "$(dirname "$0")/../../../.."
set -uf
cd .gpu/s21 && for i in 1 2; do for v in main tma3; do timeout 100 ./$v | grep -v digest; done; done
for v in main tma3; do ./$v | grep digest; done
