#!/usr/bin/env bash
# The main command of the README: installs what is missing, builds fmha, runs the C++ demo, installs the
# Python package and runs the quick benchmark on whatever device exists (GPU if present, else CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS

bash scripts/setup.sh

cuda=OFF
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && cuda=AUTO
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_ENABLE_CUDA=$cuda \
      -DFMHA_BUILD_TESTS=OFF >/dev/null
cmake --build build-demo -j "$JOBS" --target fmha_cpu_demo
build-demo/examples/fmha_cpu_demo

"$PYTHON" -m pip install -q --no-build-isolation -C cmake.define.FMHA_ENABLE_CUDA=$cuda .
"$PYTHON" -m fmha.bench --suite quick "$@"
