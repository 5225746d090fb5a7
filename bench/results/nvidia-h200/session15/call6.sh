#!/usr/bin/env bash
# Session 15 call 6 (H200): with a copy warpgroup the first phase is issued without its P V
# product (no math-thread store into a stage the copy warpgroup fills: call 4's racecheck
# hazards), with P packed before the accumulator fences (call 5's order made ptxas serialize the
# D 128 wgmma, C7512); without one, main's zeroed V stage as before. The forward timed by
# .gpu/ablate: main's kernel (_0), call 2's (ws), this one (ws3), at D 64, 128 and 80 (bucket
# 96, SAM-H's head dim); then the build, the whole CUDA suite, the forward tests on the cp.async
# path and compute-sanitizer as in call 5.
cd "$(dirname "$0")/../../../.."
set -u
for b in fwd_ablate_d64_0 fwd_ws_d64 fwd_ws3_d64 fwd_ablate_d128_0 fwd_ws_d128 fwd_ws3_d128 \
         fwd_ablate_d80_0 fwd_ws3_d80; do
  echo "== $b"; timeout 60 .gpu/ablate/$b || echo "FAIL $b"
done 2>&1 | tee "$OUT/timing.txt"
STEPS="build cuda-tests cp-async-tests sanitizer" CUDA_TESTS_SECONDS=240 SANITIZER_SECONDS=200 \
  SANITIZER_FILTER="CudaForward.ValueDimDiffersFromHeadDim:CudaForward.HeadDimsNotMultipleOf8:CudaForward.StridedLayouts:CudaForward.SinksAndExtraKeys:CudaForward.Varlen:CudaForward.BiasRegisterForm:CudaForward.EmptyQueries:CudaWindowMaskSmall*:CudaNeighborhoodSmall*" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
