#!/usr/bin/env bash
# Session 13 call 2 (H200): dilated 1-D neighborhoods of one batch run their dilation groups as
# batches of the window mask (neighborhood.cu). Build (C++ suite all buckets, Python package
# buckets 64;128), the whole CUDA suite, the na suite (fmha against compiled Flex in one process),
# then the new NA tests on the sm80 kernels. Everything lands in $OUT/call.tgz.
cd "$(dirname "$0")/../../../.."
set -u
START=$(date +%s)
left() { echo $(( ${1:-560} - ($(date +%s) - START) )); }
LOGS=$OUT/logs; mkdir -p "$LOGS"
pack() { tar -czf "$OUT/call.tgz" -C "$OUT" logs gpu-check 2>/dev/null && rm -rf "$OUT/logs" "$OUT/gpu-check"; }
trap pack EXIT
export PIP_BUCKETS="64;128"
STEPS="build cuda-tests bench" CUDA_TESTS_SECONDS=200 BENCH_SECONDS=230 \
  BENCH_RUNS="na|--impls fmha,flex --directions fwd,bwd --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
FMHA_CUDA_KERNELS=sm80 timeout "$(left 590)" build-gpu/tests/fmha_cuda_tests --gtest_brief=1 \
  --gtest_filter='CudaNeighborhood*DilationGroups*:CudaNeighborhood*OneDim*' >"$LOGS/sm80-na.log" 2>&1
echo "sm80 NA exit $?"; tail -n 3 "$LOGS/sm80-na.log"

# compute-sanitizer on the small NA tests and the new ones (call 3 on).
if [ "${SANITIZE:-0}" = 1 ]; then
  STEPS="sanitizer" SANITIZER_SECONDS="$(( $(left 590) / 2 ))" \
    SANITIZER_FILTER="CudaNeighborhoodSmall*:CudaNeighborhoodBackwardSmall*:CudaNeighborhood*DilationGroups*" \
    bash scripts/gpu-check.sh | tail -n 3
fi
rm -f "$OUT/gpu-check.tgz"
