#!/usr/bin/env bash
# Session 16 call 2: call 1's persistent forward with the copy threads' spills removed (range
# loaders for Q on the cp.async path; at D 96 the 96 of 128 copy threads that make whole rows).
# Timed against main (base_*) and with a block a tile (FMHA_SM90_PERSISTENT=0).
cd "$(dirname "$0")/../../../.."
set -u
for d in d64 d128 d80; do
  for b in base_$d pers2_$d; do
    echo "== $b"; timeout 60 .gpu/ablate/$b || echo "FAIL $b"
  done
  echo "== pers2_$d FMHA_SM90_PERSISTENT=0"; FMHA_SM90_PERSISTENT=0 timeout 60 .gpu/ablate/pers2_$d || echo "FAIL"
done 2>&1 | tee "$OUT/timing.txt"
