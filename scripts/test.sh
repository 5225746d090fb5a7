#!/usr/bin/env bash
# The test command of the README (and of CI): installs what is missing, builds the C++ library with its
# tests (and the CUDA sources when nvcc exists), runs them, installs the Python package and runs pytest.
# On a machine with a GPU the CUDA tests run too; without one they skip and say so.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS

bash scripts/setup.sh

echo "== Generated kernel sources match their generators"
"$PYTHON" scripts/gen_wgmma.py --check
"$PYTHON" scripts/gen_instantiations.py --check

echo "== C++: configure, build, test"
# Without a GPU (CI) every CUDA source is compiled once, for sm_90a (whose instructions include
# sm80's), and for five of the eight head-dim buckets: 64, 96, 128, 192 and 256 take every
# bucket-specific path of the kernels (three math warpgroups and the bias ring at 64, the narrowed
# P V, the zero V tile and 64-byte swizzles at 96, two stages and the output tile at 128, the output
# chunks at 192 / 256, the long-row tiles at 256), while 32, 160 and 224 instantiate the same code at
# other sizes. That keeps the kernels' build within minutes on 2 cores and the whole command under
# 30 minutes. With a GPU, the default architectures (sm_80 and sm_90a) and every bucket.
gpu=0
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && gpu=1
arch_args=("-DFMHA_HEAD_DIM_BUCKETS=32;64;96;128;160;192;224;256")
[ "$gpu" = 0 ] && arch_args=(-DFMHA_CUDA_ARCHITECTURES=90a-real "-DFMHA_HEAD_DIM_BUCKETS=64;96;128;192;256")
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_WARNINGS_AS_ERRORS=ON "${arch_args[@]}" >/dev/null
cmake --build build -j "$JOBS"
ctest --test-dir build -j "$JOBS" --output-on-failure

echo "== C++ under AddressSanitizer + UndefinedBehaviorSanitizer: a fuzz round"
# The short pass of scripts/sanitize-cpu.sh (4-5.5 minutes on 2 cores, nearly all of it the
# instrumented build): every entry point's valid draws against the oracle and invalid draws that
# must be refused, under the portable kernels (which the sanitizers see whole) and the machine's
# own. The whole suite and ThreadSanitizer: bash scripts/sanitize-cpu.sh.
STEPS="asan-build asan-fuzz" FUZZ_SEEDS=20261128 FUZZ_VALID=1000 FUZZ_INVALID=10000 \
  FUZZ_ISAS="portable native" JOBS=$JOBS bash scripts/sanitize-cpu.sh

echo "== C++: install, then build a separate project against it with find_package(fmha)"
cmake --install build --prefix build/install >/dev/null
cmake -S examples/consumer -B build/consumer -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/consumer >/dev/null
build/consumer/fmha_consumer >/dev/null && echo "find_package(fmha) consumer: OK"

echo "== Python: install the package, run pytest"
# The C++ build above already compiled the CUDA sources; without a GPU the Python package skips them.
cuda=OFF
[ "$gpu" = 1 ] && cuda=AUTO
"$PYTHON" -m pip install -q --no-build-isolation -C cmake.define.FMHA_ENABLE_CUDA=$cuda .
# With jax importable the package must contain the JAX front end (tests/python/test_jax.py skips
# without it, so this is where a build that left it out fails).
if "$PYTHON" -c "import jax" 2>/dev/null; then
  "$PYTHON" -c "import fmha.jax" && echo "fmha.jax: built"
fi
"$PYTHON" -m pytest -q tests/python
