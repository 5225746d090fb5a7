#!/usr/bin/env bash
# Builds the CUDA test binary on a machine without a GPU, for a GPU machine to run, so that the GPU's
# time goes to testing rather than compiling: copy .gpu/ there with the tree and `scripts/gpu-check.sh`
# takes it with PREBUILT=.gpu/prebuilt, building there instead when the binary does not run on that
# machine (other system libraries). Same configuration as gpu-check's build: sm_90a, every head-dim
# bucket unless FMHA_HEAD_DIM_BUCKETS says otherwise.
#
#   bash scripts/build-gpu-tests.sh            # -> .gpu/prebuilt/fmha_cuda_tests (+ its source revision)
set -euo pipefail
cd "$(dirname "$0")/.."
BUCKETS=${FMHA_HEAD_DIM_BUCKETS:-"32;64;96;128;160;192;224;256"}
cmake -S . -B build-prebuilt -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_ENABLE_CUDA=ON \
      -DFMHA_CUDA_ARCHITECTURES=90a-real -DFMHA_HEAD_DIM_BUCKETS="$BUCKETS" >/dev/null
cmake --build build-prebuilt --target fmha_cuda_tests -j "${JOBS:-$(nproc)}"
# Objects whose header dependencies ninja did not record are not rebuilt after a header edit (56
# kernel objects of one incremental build once kept an old forward: docs/perf-log.md, 2026-11-29):
# rebuild any such object before packing the binary.
stale=$(ninja -C build-prebuilt -t deps | sed -n 's/^\(.*\.o\): #deps 0,.*/\1/p')
if [ -n "$stale" ]; then
  echo "rebuilding $(wc -l <<<"$stale") objects without recorded header dependencies"
  (cd build-prebuilt && xargs rm -f <<<"$stale")
  cmake --build build-prebuilt --target fmha_cuda_tests -j "${JOBS:-$(nproc)}"
fi
# Stripped and xz-compressed: every bucket's kernels make a binary of about 240 MB, 25 MB packed,
# small enough to copy along with the tree.
mkdir -p .gpu/prebuilt
strip -o .gpu/prebuilt/fmha_cuda_tests build-prebuilt/tests/fmha_cuda_tests
xz -T0 -6 -f .gpu/prebuilt/fmha_cuda_tests
# What the binary was built from, for the device log (the working tree may hold uncommitted edits).
{ git rev-parse HEAD; git status --short; } >.gpu/prebuilt/revision.txt
ls -la .gpu/prebuilt/
