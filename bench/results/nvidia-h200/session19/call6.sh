#!/usr/bin/env bash
# Session 19 call 6 (fef9e7f, same warm machine as call 5): call 5's benchmarks, which its gate
# skipped, with the package call 5 installed; then the whole CUDA suite again on the prebuilt
# binary with every test's name and time (call 5's 220-second limit stopped it in the neighborhood
# tests, after every dense backward test had passed).
cd "$(dirname "$0")/../../../.."
set -uf
python3 -c "import fmha" || python3 -m pip install -q --no-build-isolation --no-deps .
for run in "features --impls fmha,sdpa-cudnn --cases SAM-B" \
           "standard --impls fmha,sdpa-flash,sdpa-cudnn --cases D(64|128)(.causal)?.L(512|2048|8192)$"; do
  set -- $run
  suite=$1; shift
  timeout 200 python3 -m fmha.bench --suite "$suite" "$@" --directions bwd --budget-ms 8 --no-plots \
    --out "$OUT/bench-$suite" > "$OUT/bench-$suite.log" 2>&1
  echo "== $suite exit $?"; cat "$OUT/bench-$suite/summary.txt"
done
cuda_root="$(dirname "$(command -v nvcc)")/.."
export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}"
TESTS=build-gpu/prebuilt/fmha_cuda_tests
[ -x "$TESTS" ] || { mkdir -p build-gpu/prebuilt && python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .gpu/prebuilt/fmha_cuda_tests.xz "$TESTS" && chmod +x "$TESTS"; }
start=$(date +%s)
timeout 420 "$TESTS" 2>&1 | grep -E "^\[ *(OK|FAILED|PASSED|RUN) *\]|tests ran|FAILED" > "$OUT/cuda-tests.txt"
echo "cuda tests exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
tail -n 5 "$OUT/cuda-tests.txt"; grep -c "^\[       OK" "$OUT/cuda-tests.txt"
