#!/usr/bin/env bash
# Session 15 call 4 (H200): the sm90 forward with a copy warpgroup, final code of the change.
# Build, the whole CUDA suite, the forward tests again with every tile on the copy warpgroup's
# cp.async (FMHA_SM90_TMA=0), compute-sanitizer memcheck and racecheck over forward tests that
# take the tensor maps, the cp.async path (varlen, unaligned rows), extra keys and the register
# forms, then pytest on CUDA tensors.
cd "$(dirname "$0")/../../../.."
set -u
STEPS="build cuda-tests cp-async-tests sanitizer python" CUDA_TESTS_SECONDS=240 \
  SANITIZER_SECONDS=200 PYTEST_SECONDS=150 \
  SANITIZER_FILTER="CudaForward.ValueDimDiffersFromHeadDim:CudaForward.HeadDimsNotMultipleOf8:CudaForward.StridedLayouts:CudaForward.SinksAndExtraKeys:CudaForward.Varlen:CudaForward.BiasRegisterForm:CudaForward.EmptyQueries:CudaWindowMaskSmall*" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
