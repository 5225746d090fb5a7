#!/usr/bin/env bash
# Session 15 call 3 (H200): call 2's copy warpgroup with its register split and D 64 stages changed
# at build time (temporary macros, not kept): r24 = 24 / 240 registers, s4 / s5 = 4 / 5 stages.
cd "$(dirname "$0")/../../../.."
cd .gpu/ablate
for b in fwd_ws_d64 fwd_ws_d64_r24 fwd_ws_d64_s4 fwd_ws_d64_r24s4 fwd_ws_d64_s5 fwd_ws_d64 \
         fwd_ws_d128 fwd_ws_d128_r24 fwd_ws_d128; do
  echo "== $b"; timeout 60 ./$b || echo FAIL
done 2>&1 | tee "$OUT/tune.txt"
