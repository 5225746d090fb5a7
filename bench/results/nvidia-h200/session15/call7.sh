#!/usr/bin/env bash
# Session 15 call 7 (H200): the copy warpgroup zeroes the V stage a first phase with P V reads
# (P = 0) itself, behind a barrier of its own, so no math thread writes a stage; whether the first
# phase issues P V (kFirstPhasePv) is per bucket: up to D 64 (call 6: without it D 64 ran 5%
# slower), not above (D 128 faster without). The forward timed by .gpu/ablate: main's kernel
# (_0), call 2's (ws), this one (ws4), and ws4pv (P V in the first phase at every bucket) at D 128
# and 80; then the build, the whole CUDA suite, the forward tests on the cp.async path,
# compute-sanitizer as in call 5 and pytest on CUDA tensors.
cd "$(dirname "$0")/../../../.."
set -u
for b in fwd_ablate_d64_0 fwd_ws_d64 fwd_ws4_d64 fwd_ablate_d128_0 fwd_ws_d128 fwd_ws4_d128 \
         fwd_ws4pv_d128 fwd_ablate_d80_0 fwd_ws4_d80 fwd_ws4pv_d80; do
  echo "== $b"; timeout 60 .gpu/ablate/$b || echo "FAIL $b"
done 2>&1 | tee "$OUT/timing.txt"
STEPS="build cuda-tests cp-async-tests sanitizer python" CUDA_TESTS_SECONDS=240 \
  SANITIZER_SECONDS=200 PYTEST_SECONDS=150 \
  SANITIZER_FILTER="CudaForward.ValueDimDiffersFromHeadDim:CudaForward.HeadDimsNotMultipleOf8:CudaForward.StridedLayouts:CudaForward.SinksAndExtraKeys:CudaForward.Varlen:CudaForward.BiasRegisterForm:CudaForward.EmptyQueries:CudaWindowMaskSmall*:CudaNeighborhoodSmall*" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
