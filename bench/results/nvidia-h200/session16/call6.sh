#!/usr/bin/env bash
# Session 16 call 6: Q by TMA after K(0) (the next tile's first K / V copies no longer wait behind
# Q's wait for the epilogue at D 128), and the launcher's rule (a block a tile where the output
# shares Q's tile and rows pass 4096 keys). Timed against main: D 128 by the rule, forced
# persistent (FMHA_SM90_PERSISTENT=132) and a block a tile (=0); D 64 and 80 by the rule. Then
# the build, the whole CUDA suite, the forward tests on the cp.async path and with 3 / 2
# persistent blocks, compute-sanitizer.
cd "$(dirname "$0")/../../../.."
set -u
{
  for b in base_d128 st2_d128; do echo "== $b"; timeout 60 .gpu/ablate/$b; done
  echo "== st2_d128 FMHA_SM90_PERSISTENT=132"; FMHA_SM90_PERSISTENT=132 timeout 60 .gpu/ablate/st2_d128
  echo "== st2_d128 FMHA_SM90_PERSISTENT=0"; FMHA_SM90_PERSISTENT=0 timeout 60 .gpu/ablate/st2_d128
  for b in base_d64 st2_d64 base_d80 st2_d80; do echo "== $b"; timeout 60 .gpu/ablate/$b; done
} 2>&1 | tee "$OUT/timing.txt"
STEPS="build cuda-tests cp-async-tests persistent-tests sanitizer" CUDA_TESTS_SECONDS=200 SANITIZER_SECONDS=100 \
  SANITIZER_FILTER="CudaForward.HeadDimsNotMultipleOf8:CudaForward.Varlen:CudaForward.SinksAndExtraKeys:CudaForward.EmptyQueries:CudaWindowMaskSmall*" \
  bash scripts/gpu-check.sh
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
