#!/usr/bin/env bash
# Session 18 call 2 (same warm machine as call 1, the package call 1 installed): fp32 against the
# efficient backend.
timeout 200 python3 -m fmha.bench --suite features --impls fmha,sdpa-efficient,sdpa-flash \
  --directions fwd,bwd --cases 'fp32 B4' --budget-ms 8 --no-plots --out "$OUT/bench"
