#!/usr/bin/env bash
# Session 22 call 10: the racecheck hazards of call 7 in detail (which threads, which blocks): the
# backward test alone, every hazard reported with its threads.
cd "$(dirname "$0")/../../../.."
set -u
cuda_root="$(dirname "$(command -v nvcc)")/.."
export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}"
mkdir -p build-gpu/prebuilt
python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
  .gpu/prebuilt/fmha_cuda_tests.xz build-gpu/prebuilt/fmha_cuda_tests && chmod +x build-gpu/prebuilt/fmha_cuda_tests
timeout 200 compute-sanitizer --tool racecheck --racecheck-report hazard --show-backtrace no \
  build-gpu/prebuilt/fmha_cuda_tests --gtest_brief=1 --gtest_filter=CudaBackward.Float32Sm90Planes \
  > "$OUT/racecheck.log" 2>&1
grep -v "^\[ errors \]" "$OUT/racecheck.log" | head -60
grep -c "Race\|hazard" "$OUT/racecheck.log"
