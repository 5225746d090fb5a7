#!/usr/bin/env bash
# Memory safety of the C++ library on CPU, in one command: builds the library and its tests with
# AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/), runs the whole ctest suite and a fuzz
# round under them, then builds with ThreadSanitizer (build-tsan/) and runs the tests that use the
# CPU backends' threads. Prints a summary and exits non-zero on any finding or failed test.
#
#   bash scripts/sanitize-cpu.sh                       # everything (about 32 minutes on 2 cores)
#   STEPS="asan-build asan-fuzz" FUZZ_SEEDS="7 8" bash scripts/sanitize-cpu.sh
#
# Steps (STEPS, in this order): asan-build, asan-ctest (every test, each in its own process),
# asan-fuzz (Fuzz.* once per seed of FUZZ_SEEDS with FUZZ_VALID / FUZZ_INVALID draws, each seed
# under every CPU ISA of FUZZ_ISAS, FMHA_CPU_ISA's values: portable, avx2, avx512, avx512bf16 or native, the
# CPU's best; the portable kernels are plain C++ that the sanitizers see whole, the AVX2 / AVX-512
# ones load through intrinsics, whose masked loads ASan does not check), tsan-build, tsan-tests
# (TSAN_FILTER, with 4 threads for each CPU backend). A failing fuzz draw prints the command that
# replays it; run that binary from build-asan/.
#
# Times on a 2-core AMD EPYC (Zen 5), GCC 12.2, 2026-11-28: asan-build 3m44s-5m09s, asan-ctest
# 3m10s-7m51s (by the machine's load), asan-fuzz 15-70 s per seed and ISA at 3000 valid / 50000
# invalid draws, tsan-build 5m08s, tsan-tests 13m53s. CI (scripts/test.sh) runs the short pass,
# asan-build and asan-fuzz at 1000 / 10000 draws under the portable and the native kernels (4-5.5
# minutes, nearly all of it the build); the whole suite and ThreadSanitizer do not fit its budget:
# run them before merging changes to src/cpu/, src/reference/, src/api/ or the tests' harness.
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
STEPS=${STEPS:-"asan-build asan-ctest asan-fuzz tsan-build tsan-tests"}
ASAN_DIR=${ASAN_DIR:-build-asan}
TSAN_DIR=${TSAN_DIR:-build-tsan}
FUZZ_SEEDS=${FUZZ_SEEDS:-"100001"}
FUZZ_VALID=${FUZZ_VALID:-1000}
FUZZ_INVALID=${FUZZ_INVALID:-10000}
FUZZ_ISAS=${FUZZ_ISAS:-"portable avx2 avx512"}
TSAN_FILTER=${TSAN_FILTER:-"CpuBackend.BitwiseIndependentOfThreadCount:CpuBackend.ConcurrentCallsFromSeveralThreads:CpuBackend.Varlen:CpuBackend.Neighborhood:Determinism.*:Merge.*"}

# Stop at the first report, with a stack; UBSan's checks are fatal (-fno-sanitize-recover).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

ASAN_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
TSAN_FLAGS="-fsanitize=thread -fno-omit-frame-pointer"

summary=()
failed=0
# step NAME COMMAND...: runs one step, records its time and result.
step() {
  local name=$1
  shift
  echo "== $name"
  local start=$SECONDS
  if "$@"; then
    summary+=("$(printf '%-12s ok      %5ds' "$name" $((SECONDS - start)))")
  else
    summary+=("$(printf '%-12s FAILED  %5ds' "$name" $((SECONDS - start)))")
    failed=1
  fi
}

configure_and_build() {  # DIR FLAGS
  cmake -S . -B "$1" -G Ninja -DFMHA_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DFMHA_BUILD_EXAMPLES=OFF -DCMAKE_CXX_FLAGS="$2" -DCMAKE_EXE_LINKER_FLAGS="$2" \
      -DCMAKE_SHARED_LINKER_FLAGS="$2" >/dev/null &&
    cmake --build "$1" -j "$JOBS" --target fmha_tests
}

asan_fuzz() {
  local seed isa ok=0
  for seed in $FUZZ_SEEDS; do
    for isa in $FUZZ_ISAS; do
      echo "-- seed $seed, FMHA_CPU_ISA=$isa: $FUZZ_VALID valid, $FUZZ_INVALID invalid draws"
      FMHA_CPU_ISA=$isa FMHA_FUZZ_SEED=$seed FMHA_FUZZ_VALID=$FUZZ_VALID \
          FMHA_FUZZ_INVALID=$FUZZ_INVALID "$ASAN_DIR/tests/fmha_tests" --gtest_brief=1 \
          --gtest_filter='Fuzz.*' || ok=1
    done
  done
  return $ok
}

for s in $STEPS; do
  case $s in
    asan-build) step "$s" configure_and_build "$ASAN_DIR" "$ASAN_FLAGS" ;;
    asan-ctest) step "$s" ctest --test-dir "$ASAN_DIR" -j "$JOBS" --output-on-failure ;;
    asan-fuzz) step "$s" asan_fuzz ;;
    tsan-build) step "$s" configure_and_build "$TSAN_DIR" "$TSAN_FLAGS" ;;
    # Several threads even on a 1-core machine: the pool's helpers must start.
    tsan-tests) step "$s" env FMHA_CPU_THREADS=4 FMHA_REFERENCE_THREADS=4 \
        "$TSAN_DIR/tests/fmha_tests" --gtest_brief=1 --gtest_filter="$TSAN_FILTER" ;;
    *) echo "unknown step '$s' (steps: asan-build asan-ctest asan-fuzz tsan-build tsan-tests)"; exit 2 ;;
  esac
done

echo "== Summary ($(${CXX:-c++} --version | head -1))"
printf '%s\n' "${summary[@]}"
if [ "$failed" = 0 ]; then
  echo "sanitize-cpu: no finding"
else
  echo "sanitize-cpu: FAILED (see the reports above)"
fi
exit $failed
