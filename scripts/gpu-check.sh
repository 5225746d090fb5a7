#!/usr/bin/env bash
# One call on a GPU machine: build fmha with the CUDA backend, run the GPU test suite, compute-sanitizer
# (memcheck, racecheck) over a small part of it, the Python tests on CUDA tensors, and the quick benchmark.
# Logs go to $OUT (default build-gpu/; a remote runner can fetch that folder); a short table is printed last.
#
#   bash scripts/gpu-check.sh                 # everything
#   STEPS="build cuda-tests" bash scripts/gpu-check.sh
#   STEPS="build cuda-tests bench" CUDA_TESTS_FILTER="CudaBackward*" BENCH_SUITE=features \
#     BENCH_ARGS="--cases bias|softcap --impls fmha,sdpa-cudnn,flex" bash scripts/gpu-check.sh
#   STEPS="ncu" NCU_CASES="dense-d64:forward_kernel na2d-k13:forward_kernel" bash scripts/gpu-check.sh
#   PREBUILT=.gpu/prebuilt bash scripts/gpu-check.sh   # the test binary built here beforehand by
#                                                      # scripts/build-gpu-tests.sh (carry .gpu)
#   BENCH_RUNS="standard|--cases D64 --impls fmha,sdpa-flash;na|--impls fmha,flex" \
#     STEPS="build cuda-tests bench" bash scripts/gpu-check.sh   # several bench runs, one process each
#   STEPS="build fuzz" FUZZ_VALID=50000 bash scripts/gpu-check.sh   # the long fuzzing run (optional step)
#   STEPS="kernel-timing" bash scripts/gpu-check.sh   # the kernels alone (bench/cpp; optional step)
#   PARALLEL=1 PREBUILT=.gpu/prebuilt bash scripts/gpu-check.sh   # the test steps side by side (below)
# PARALLEL=1: the GPU test steps (cuda-tests and sm80-tests in SHARDS gtest shards each, cp-async,
# long-rows, persistent, sanitizer) run at once, each in its own process and log, while the Python
# package builds; then python, fuzz, bench, ncu and kernel-timing as usual, and stress last (its
# out-of-memory test fills the device). The tests check results, not speed, and share one GPU
# easily: on an H200 (2026-11-28) the test steps side by side finished in about 6 minutes, where
# their own times, each slowed by the others, add up to 27. A step left out by the gate (bench) or
# by STEPS leaves the background pip install running after the script.
# A failed cuda-tests step skips the bench and ncu steps (their device time would time a broken build;
# GATE=0 runs them anyway).
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${OUT:-$PWD/build-gpu}
OUT=$RESULTS/gpu-check  # every log and the benchmark output; packed into one archive at the end
mkdir -p "$OUT"
ARCHS=${FMHA_CUDA_ARCHITECTURES:-90a-real}
# Fewer head-dim buckets build faster (e.g. "64;128" for a quick benchmark; the GPU tests need all;
# PIP_BUCKETS narrows only the Python package, for the benchmark).
BUCKETS=${FMHA_HEAD_DIM_BUCKETS:-"32;64;96;128;160;192;224;256"}
STEPS=${STEPS:-"build cuda-tests sm80-tests cp-async-tests persistent-tests long-rows-tests sanitizer stress python bench"}
SANITIZER_FILTER=${SANITIZER_FILTER:-"*Small*:*HeadDimsNotMultipleOf8*:*Varlen*:*WideHeads*:*Float32Sm90Planes*"}
JOBS=$(nproc)
GTEST_SRC=${GTEST_SRC:-$PWD/.gpu/googletest}
[ -f /usr/include/gtest/gtest.h ] && GTEST_SRC=""
# PREBUILT: a carried folder with fmha_cuda_tests built on another machine (scripts/build-gpu-tests.sh);
# the build step then only checks that it runs here, and builds as usual when it does not.
PREBUILT=${PREBUILT:-}
TESTS=build-gpu/tests/fmha_cuda_tests
PARALLEL=${PARALLEL:-0}
SHARDS=${SHARDS:-3}

rows=()
run_step() {  # name, then the command; records PASS/FAIL, seconds and the log's last summary line
  local name=$1; shift
  local start=$(date +%s) status=PASS
  "$@" >"$OUT/$name.log" 2>&1 || status=FAIL
  local summary
  summary=$(grep -E "PASSED|FAILED|passed|failed|ERROR SUMMARY|error" "$OUT/$name.log" | tail -n 1 | cut -c1-90)
  rows+=("$(printf '%-12s %-5s %5ss  %s' "$name" "$status" "$(( $(date +%s) - start ))" "$summary")")
  echo "[$name] $status"
}

has() { [[ " $STEPS " == *" $1 "* ]]; }

# PARALLEL=1: run_step in the background, its table row written to $OUT/<name>.row for
# collect_rows (rows of a background process do not reach this one's array).
pids=()
run_step_in_background() {
  local name=$1
  (run_step "$@"; printf '%s\n' "${rows[-1]}" >"$OUT/$name.row") &
  pids+=($!)
}
collect_rows() {  # waits for the background steps, then adds their rows in the order given
  local name
  wait "${pids[@]}"
  pids=()
  for name in "$@"; do
    [ -f "$OUT/$name.row" ] && rows+=("$(cat "$OUT/$name.row")")
  done
}
# One gtest shard of a test step: GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX reach the binary.
shard() {  # index, then the step's function
  local index=$1; shift
  GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$index "$@"
}

build() {
  nvidia-smi -L && nvcc --version | tail -n 2
  if [ -n "$PREBUILT" ]; then
    # libcudart.so of this machine's toolkit, wherever it lives; python's lzma unpacks the binary.
    local cuda_root
    cuda_root="$(dirname "$(command -v nvcc)")/.."
    export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}"
    mkdir -p build-gpu/prebuilt
    python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
      "$PREBUILT/fmha_cuda_tests.xz" build-gpu/prebuilt/fmha_cuda_tests &&
      chmod +x build-gpu/prebuilt/fmha_cuda_tests
    if build-gpu/prebuilt/fmha_cuda_tests --gtest_list_tests >/dev/null; then
      TESTS=build-gpu/prebuilt/fmha_cuda_tests
      echo "prebuilt test binary runs here, built from:"; cat "$PREBUILT/revision.txt"
      return 0
    fi
    echo "prebuilt test binary does not run here: building"
  fi
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_ENABLE_CUDA=ON \
        -DFMHA_CUDA_ARCHITECTURES="$ARCHS" -DFMHA_HEAD_DIM_BUCKETS="$BUCKETS" \
        ${GTEST_SRC:+-DFMHA_GTEST_SOURCE_DIR=$GTEST_SRC} &&
    cmake --build build-gpu -j "$JOBS"
}
# The Python package builds in the background while the C++ suite builds and runs: `pip install`
# offline with the machine's own torch/nanobind/scikit-build-core, as a user would.
python_install() {
  FMHA_CUDA_ARCHITECTURES="$ARCHS" FMHA_HEAD_DIM_BUCKETS="${PIP_BUCKETS:-$BUCKETS}" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
    python3 -m pip install -q --no-build-isolation --no-deps .
}
cuda_tests() {
  timeout "${CUDA_TESTS_SECONDS:-300}" "$TESTS" --gtest_brief=1 \
      --gtest_filter="${CUDA_TESTS_FILTER:-*:-CudaStress.*}"
}
# On Hopper dense and neighborhood attention run the sm90 kernels; run their tests again
# on the sm80 kernels (fp32 runs the sm80 kernels everywhere: its tests need no second pass).
sm80_tests() {
  FMHA_CUDA_KERNELS=sm80 timeout "${CUDA_TESTS_SECONDS:-300}" "$TESTS" \
      --gtest_brief=1 --gtest_filter="CudaForward*:CudaBackward*:CudaNeighborhood*:-*Float32*"
}
# The sm90 forward's copy warpgroup, and the backward kernels' bias tiles, take dense tiles through
# the tensor-memory accelerator; run the forward and bias backward tests again with every tile on
# its cp.async path (varlen, extra keys and unaligned rows take that path anyway).
cp_async_tests() {
  FMHA_SM90_TMA=0 timeout "${CUDA_TESTS_SECONDS:-300}" "$TESTS" \
      --gtest_brief=1 --gtest_filter="CudaForward*:CudaBackward.Bias*:-*Float32*"
}
# The sm90 forward's 80-key tiles for plain attention over long rows at D 256 (FMHA_SM90_LONG_ROWS=1,
# not yet the default): the forward tests, and the backward's that run the forward at D 256.
long_rows_tests() {
  FMHA_SM90_LONG_ROWS=1 timeout "${CUDA_TESTS_SECONDS:-300}" "$TESTS" \
      --gtest_brief=1 --gtest_filter="CudaForward*:CudaBackward.WideHeads*:-*Float32*"
}
# The sm90 forward's blocks with a copy warpgroup are persistent: one block an SM walks several
# tiles, carrying stage slots and barrier phases from tile to tile. The tests' grids are small
# (mostly one tile a block); run the forward tests again with 3 blocks (TMA; the neighborhood
# forward's too, whose copy warpgroup stages each tile's boxes) and 2 (cp.async) so that every
# block walks many tiles: varlen's skipped tiles, causal rows without keys, extra keys.
persistent_tests() {
  FMHA_SM90_PERSISTENT=3 timeout "${CUDA_TESTS_SECONDS:-300}" "$TESTS" \
      --gtest_brief=1 --gtest_filter="CudaForward*:CudaNeighborhood.*:CudaNeighborhoodSmall.*:-*Float32*" &&
  FMHA_SM90_PERSISTENT=2 FMHA_SM90_TMA=0 timeout "${CUDA_TESTS_SECONDS:-300}" "$TESTS" \
      --gtest_brief=1 --gtest_filter="CudaForward*:-*Float32*"
}
# Memcheck and racecheck over SANITIZER_FILTER (its *Varlen* takes the bad-offset tests of
# tests/cuda/test_cuda_varlen_safety.cpp); memcheck again over those on the sm80 kernels; racecheck
# again over the forward tests with two persistent blocks (hazards between one tile's reads and the
# next tile's copies).
VARLEN_SAFETY_FILTER=${VARLEN_SAFETY_FILTER:-"*VarlenSafety*:*VarlenHostCheck*"}
PERSISTENT_RACECHECK_FILTER=${PERSISTENT_RACECHECK_FILTER:-"CudaForward.OddShapesAndHeadDims:CudaForward.Varlen:CudaForward.SinksAndExtraKeys:CudaForward.CausalBothAlignments:CudaForward.EmptyQueries:CudaForward.BiasRegisterForm:CudaForward.BiasStagedTiles:CudaNeighborhoodSmall.OneDim:CudaNeighborhoodSmall.TwoAndThreeDim"}
sanitizer() {
  FMHA_SM90_PERSISTENT=2 timeout "${SANITIZER_SECONDS:-300}" compute-sanitizer --tool racecheck \
      --error-exitcode 1 "$TESTS" --gtest_brief=1 --gtest_filter="$PERSISTENT_RACECHECK_FILTER" &&
  timeout "${SANITIZER_SECONDS:-300}" compute-sanitizer --tool memcheck --error-exitcode 1 "$TESTS" \
      --gtest_brief=1 --gtest_filter="$SANITIZER_FILTER" &&
  FMHA_CUDA_KERNELS=sm80 timeout "${SANITIZER_SECONDS:-300}" compute-sanitizer --tool memcheck \
      --error-exitcode 1 "$TESTS" --gtest_brief=1 --gtest_filter="$VARLEN_SAFETY_FILTER" &&
  timeout "${SANITIZER_SECONDS:-300}" compute-sanitizer --tool racecheck --error-exitcode 1 "$TESTS" \
      --gtest_brief=1 --gtest_filter="$SANITIZER_FILTER"
}
# Host threads on streams of their own, CUDA-graph capture and replay, out-of-memory and the calls
# after it (tests/cuda/test_cuda_stress.cpp; the Python graph and out-of-memory tests in
# tests/python/test_cuda_stress.py). Not in cuda-tests: the out-of-memory test fills the device.
stress() {
  local status=0
  timeout "${STRESS_SECONDS:-300}" "$TESTS" --gtest_brief=1 --gtest_filter="CudaStress.*" || status=1
  pip_ready || return 1
  timeout "${STRESS_SECONDS:-300}" python3 -m pytest -q tests/python/test_cuda_stress.py \
      -p no:cacheprovider || status=1
  return $status
}
# The long fuzzing run, an optional step: the fuzzing harness's draws on CUDA tensors, C++
# (tests/cuda/test_cuda_fuzz.cpp: FUZZ_INVALID refused calls, FUZZ_VALID checked against the
# oracle) and Python (tests/python/test_fuzz.py: FUZZ_PY_INVALID, FUZZ_PY_VALID), from FUZZ_SEED
# (default: today's date, so that each day draws anew and the log says how to replay a failure).
fuzz() {
  local seed=${FUZZ_SEED:-$(date +%Y%m%d)} status=0
  echo "fuzz seed $seed"
  FMHA_FUZZ_SEED=$seed FMHA_FUZZ_INVALID=${FUZZ_INVALID:-200000} FMHA_FUZZ_VALID=${FUZZ_VALID:-20000} \
    timeout "${FUZZ_SECONDS:-600}" "$TESTS" --gtest_brief=1 --gtest_filter="CudaFuzz.*" || status=1
  pip_ready || return 1
  FMHA_FUZZ_SEED=$seed FMHA_FUZZ_PY_INVALID=${FUZZ_PY_INVALID:-20000} FMHA_FUZZ_PY_VALID=${FUZZ_PY_VALID:-2000} \
    timeout "${FUZZ_SECONDS:-600}" python3 -m pytest -q tests/python/test_fuzz.py -k cuda -p no:cacheprovider ||
    status=1
  return $status
}
PIP_STATUS=""
pip_ready() {  # waits for the background install once; later calls reuse its status
  [ -z "$PIP_STATUS" ] && { wait "$PIP_PID"; PIP_STATUS=$?; }
  [ "$PIP_STATUS" = 0 ] || { echo "pip install failed:"; cat "$OUT/pip-install.log"; return 1; }
}
python_tests() {
  pip_ready || return 1
  timeout "${PYTEST_SECONDS:-600}" python3 -m pytest -q tests/python -k "${PYTEST_FILTER:-cuda}" -p no:cacheprovider
}
# BENCH_RUNS: runs separated by ';', each "suite|arguments" (arguments split at spaces, so a --cases
# pattern holds no space: `D64.*L512$`), each in its own process and folder $OUT/bench/<n>-<suite>;
# without it, one run of BENCH_SUITE with BENCH_ARGS into $OUT/bench.
bench() {
  pip_ready || return 1
  if [ -z "${BENCH_RUNS:-}" ]; then
    timeout "${BENCH_SECONDS:-240}" python3 -m fmha.bench --suite "${BENCH_SUITE:-quick}" \
        --out "$OUT/bench" ${BENCH_ARGS:-}
    return
  fi
  local run n=0 status=0
  local -; set -f  # no pathname expansion of the patterns in the arguments
  IFS=';' read -ra runs <<<"$BENCH_RUNS"
  for run in "${runs[@]}"; do
    n=$((n + 1))
    local suite=${run%%|*} args=""
    [[ "$run" == *"|"* ]] && args=${run#*|}
    # shellcheck disable=SC2086  # the arguments are meant to split
    timeout "${BENCH_SECONDS:-240}" python3 -m fmha.bench --suite "$suite" \
        --out "$OUT/bench/$n-$suite" $args || status=1
  done
  return $status
}

# The kernels alone, an optional step (bench/cpp, built here with nvcc, no library): the sm90 forward
# at the head-dim buckets of TIMING_BUCKETS, and the KV cache's split-KV kernels, whose tool also
# checks the tensor-core kernel's out and lse against the CUDA-core kernel's (exit 1 on a mismatch).
kernel_timing() {
  local b status=0 nvcc_args=(-std=c++17 --expt-relaxed-constexpr -O3
    -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -Ibench/cpp)
  mkdir -p build-gpu/timing
  for b in ${TIMING_BUCKETS:-64 128 256}; do
    nvcc "${nvcc_args[@]}" -DFMHA_TIMING_BUCKET="$b" -DFMHA_TIMING_D="$b" \
      -o "build-gpu/timing/sm90-forward-timing-$b" bench/cpp/sm90_forward_timing.cu -lcuda &
  done
  nvcc "${nvcc_args[@]}" -o build-gpu/timing/kv-cache-decode-timing \
    bench/cpp/kv_cache_decode_timing.cu &
  wait
  for b in ${TIMING_BUCKETS:-64 128 256}; do
    timeout "${TIMING_SECONDS:-120}" "build-gpu/timing/sm90-forward-timing-$b" || status=1
    # D 256 again with the 80-key tiles of long rows (from 1024 keys; not yet the default).
    [ "$b" = 256 ] && { FMHA_SM90_LONG_ROWS=1 timeout "${TIMING_SECONDS:-120}" \
      "build-gpu/timing/sm90-forward-timing-$b" | sed 's/^/long-rows /' || status=1; }
  done
  timeout "${TIMING_SECONDS:-120}" build-gpu/timing/kv-cache-decode-timing || status=1
  return $status
}

# Nsight Compute on one launch per "case:kernel" of NCU_CASES (scripts/ncu-kernels.sh).
ncu_profiles() {
  pip_ready || return 1
  local item status=0
  for item in ${NCU_CASES:-dense-d64:forward_kernel}; do
    CASE=${item%%:*} KERNEL=${item#*:} OUT=$OUT bash scripts/ncu-kernels.sh || status=1
  done
  return $status
}

if has python || has bench || has ncu || has fuzz || has stress; then
  python_install >"$OUT/pip-install.log" 2>&1 &
  PIP_PID=$!
fi
has build && run_step build build
if [ "$PARALLEL" = 1 ]; then
  names=()
  for i in $(seq 0 $((SHARDS - 1))); do
    has cuda-tests && { run_step_in_background "cuda-tests-$i" shard "$i" cuda_tests; names+=("cuda-tests-$i"); }
    has sm80-tests && { run_step_in_background "sm80-tests-$i" shard "$i" sm80_tests; names+=("sm80-tests-$i"); }
  done
  for step in cp-async-tests:cp_async_tests persistent-tests:persistent_tests \
              long-rows-tests:long_rows_tests sanitizer:sanitizer; do
    has "${step%%:*}" && { run_step_in_background "${step%%:*}" "${step#*:}"; names+=("${step%%:*}"); }
  done
  collect_rows "${names[@]}"
  failed_tests=$(printf '%s\n' "${rows[@]}" | grep -c "^cuda-tests-[0-9]* *FAIL ")
else
  has cuda-tests && run_step cuda-tests cuda_tests
  failed_tests=0
  has cuda-tests && [[ "${rows[-1]}" == *" FAIL "* ]] && failed_tests=1
fi
# The gate: a build whose tests fail is not benchmarked or profiled.
if has cuda-tests && [ "${GATE:-1}" = 1 ] && [ "$failed_tests" != 0 ]; then
  echo "cuda-tests failed: skipping bench and ncu (GATE=0 runs them)"
  STEPS=${STEPS// bench/}; STEPS=${STEPS// ncu/}
fi
if [ "$PARALLEL" != 1 ]; then
  has sm80-tests && run_step sm80-tests sm80_tests
  has cp-async-tests && run_step cp-async-tests cp_async_tests
  has persistent-tests && run_step persistent-tests persistent_tests
  has long-rows-tests && run_step long-rows-tests long_rows_tests
  has sanitizer && run_step sanitizer sanitizer
  has stress && run_step stress stress
fi
has python && run_step python python_tests
has fuzz && run_step fuzz fuzz
has bench && run_step bench bench
has ncu && run_step ncu ncu_profiles
has kernel-timing && run_step kernel-timing kernel_timing
# Side by side, the stress step comes last: its out-of-memory test fills the device.
[ "$PARALLEL" = 1 ] && has stress && run_step stress stress

echo
echo "== gpu-check summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1))"
printf '%s\n' "${rows[@]}"
for summary in "$OUT"/bench/summary.txt "$OUT"/bench/*/summary.txt; do
  [ -f "$summary" ] && { echo; cat "$summary"; }
done
has ncu && { echo; grep -v "^ncu\|^==PROF==" "$OUT/ncu.log" | tail -n 60; }
has kernel-timing && { echo; grep -E "TFLOP/s|TB/s|diff|FAIL|error" "$OUT/kernel-timing.log" | tail -n 80; }
# One archive of everything, for runners that fetch only a handful of files.
tar -czf "$RESULTS/gpu-check.tgz" -C "$RESULTS" gpu-check && [ -n "${PACK_ONLY:-}" ] && rm -rf "$OUT"
exit 0
