#!/usr/bin/env bash
# Session 15 call 2 (H200): the sm90 forward with a copy warpgroup (TMA, mbarrier stages) for the
# range policies up to D 128. The D 64 / 128 forward timed by .gpu/ablate (main's kernel built
# before the change against this one, same process order), then the build and the whole CUDA suite.
cd "$(dirname "$0")/../../../.."
set -u
for b in fwd_ablate_d64_0 fwd_ws_d64 fwd_ablate_d128_0 fwd_ws_d128; do
  timeout 60 .gpu/ablate/$b || echo "FAIL $b"
done 2>&1 | tee "$OUT/timing.txt"
STEPS="build cuda-tests" CUDA_TESTS_SECONDS=240 bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
