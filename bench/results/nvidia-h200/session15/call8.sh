#!/usr/bin/env bash
# Session 15 call 8 (H200): the final code. The copy warpgroup zeroes the first phase's V stage
# while Q is in flight and waits for all its cp.async copies (committed or not: call 7's racecheck
# found the Q copies unwaited on the cp.async path) before its plain arrival on Q's barrier; the
# first phase issues P V up to bucket 96. Build (C++ suite all buckets, Python package 64;96;128),
# the whole CUDA suite, the forward tests on the cp.async path, compute-sanitizer as in call 5,
# then the dense forward grid against FA2 and cuDNN and the SAM cases against cuDNN, one process
# each.
cd "$(dirname "$0")/../../../.."
set -u
export PIP_BUCKETS="64;96;128"
STEPS="build cuda-tests cp-async-tests sanitizer bench" CUDA_TESTS_SECONDS=220 \
  SANITIZER_SECONDS=120 BENCH_SECONDS=110 \
  SANITIZER_FILTER="CudaForward.ValueDimDiffersFromHeadDim:CudaForward.HeadDimsNotMultipleOf8:CudaForward.StridedLayouts:CudaForward.SinksAndExtraKeys:CudaForward.Varlen:CudaForward.BiasRegisterForm:CudaForward.EmptyQueries:CudaWindowMaskSmall*:CudaNeighborhoodSmall*" \
  BENCH_RUNS="standard|--impls fmha,sdpa-flash,sdpa-cudnn --directions fwd --cases D(64|128)(.causal)?.L(512|2048|8192)$ --budget-ms 8 --no-plots;features|--impls fmha,sdpa-cudnn --directions fwd --cases SAM --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
