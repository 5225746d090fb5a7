#!/usr/bin/env bash
# Session 13 call 1 (H200): the neighborhood kernels' bit-mask window test (working tree) against
# main (.gpu/mainsrc: `git archive` of b23ddf2, carried).
# 1. build the working tree (C++ suite, all buckets) and its Python package (buckets 64;128), and
#    main's package beside it (--target /tmp/fmha-main), all at once;
# 2. the whole CUDA suite;
# 3. the na suite, fmha against compiled Flex in one process (working tree), then main's fmha alone
#    in a second process on the same machine;
# 4. the NA tests on the sm80 kernels (neighborhood_mask.cuh is shared with them).
# Everything lands in $OUT/call.tgz (the device tool brings back 8 files at most).
cd "$(dirname "$0")/../../../.."
set -u
START=$(date +%s)
left() { echo $(( ${1:-560} - ($(date +%s) - START) )); }
LOGS=$OUT/logs; mkdir -p "$LOGS"
pack() { tar -czf "$OUT/call.tgz" -C "$OUT" logs gpu-check 2>/dev/null && rm -rf "$OUT/logs" "$OUT/gpu-check"; }
trap pack EXIT
export PIP_BUCKETS="64;128"
( cd .gpu/mainsrc && FMHA_CUDA_ARCHITECTURES=90a-real FMHA_HEAD_DIM_BUCKETS="64;128" \
    CMAKE_BUILD_PARALLEL_LEVEL=6 python3 -m pip install -q --no-build-isolation --no-deps \
    --target /tmp/fmha-main . >"$LOGS/main-pip.log" 2>&1; echo "main pip exit $?" >>"$LOGS/main-pip.log" ) &
MAIN_PID=$!
STEPS="build cuda-tests bench" CUDA_TESTS_SECONDS=200 BENCH_SECONDS=200 \
  BENCH_RUNS="na|--impls fmha,flex --directions fwd,bwd --budget-ms 8 --no-plots" \
  bash scripts/gpu-check.sh
wait $MAIN_PID; tail -n 2 "$LOGS/main-pip.log"
PYTHONPATH=/tmp/fmha-main timeout "$(left 520)" python3 -m fmha.bench --suite na --impls fmha \
  --directions fwd,bwd --budget-ms 8 --no-plots --out "$LOGS/main-na" >"$LOGS/main-na.log" 2>&1
echo "main na exit $?"; cat "$LOGS/main-na/summary.txt" 2>/dev/null
FMHA_CUDA_KERNELS=sm80 timeout "$(left 575)" build-gpu/tests/fmha_cuda_tests --gtest_brief=1 \
  --gtest_filter='CudaNeighborhood*' >"$LOGS/sm80-na.log" 2>&1
echo "sm80 NA exit $?"; tail -n 3 "$LOGS/sm80-na.log"
rm -f "$OUT/gpu-check.tgz"
