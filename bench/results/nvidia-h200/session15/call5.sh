#!/usr/bin/env bash
# Session 15 call 5 (H200): the first phase issued without its P V product (no zeroed V stage, so
# no math-thread store into a stage the copy warpgroup fills: call 4's racecheck hazards). The
# D 64 / 128 forward timed by .gpu/ablate (main's kernel, call 2's, this one), then the build, the
# whole CUDA suite, the forward tests on the cp.async path and compute-sanitizer as in call 4.
cd "$(dirname "$0")/../../../.."
set -u
for b in fwd_ablate_d64_0 fwd_ws_d64 fwd_ws2_d64 fwd_ablate_d128_0 fwd_ws_d128 fwd_ws2_d128; do
  echo "== $b"; timeout 60 .gpu/ablate/$b || echo "FAIL $b"
done 2>&1 | tee "$OUT/timing.txt"
STEPS="build cuda-tests cp-async-tests sanitizer" CUDA_TESTS_SECONDS=240 SANITIZER_SECONDS=200 \
  SANITIZER_FILTER="CudaForward.ValueDimDiffersFromHeadDim:CudaForward.HeadDimsNotMultipleOf8:CudaForward.StridedLayouts:CudaForward.SinksAndExtraKeys:CudaForward.Varlen:CudaForward.BiasRegisterForm:CudaForward.EmptyQueries:CudaWindowMaskSmall*:CudaNeighborhoodSmall*" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
