#!/usr/bin/env bash
# Session 19 call 8 (3db1cf3: the fused backward's warpgroup barriers on their own ids, the dK/dV
# kernel's ping-pong for the plain policy only): bench/cpp/sm90_backward_timing.cu on main's kernels
# (19a9099, `main`) and on 3db1cf3's (`pp`), alternated twice; the whole CUDA suite on the prebuilt
# test binary (scripts/build-gpu-tests.sh at 3db1cf3); memcheck and racecheck over call 7's backward
# tests and the fused backward's.
cd "$(dirname "$0")/../../../.."
set -uf
(cd .gpu/s19 && for i in 1 2; do for v in main pp; do timeout 60 ./$v; done; done)
nvidia-smi --query-gpu=name --format=csv,noheader
cuda_root="$(dirname "$(command -v nvcc)")/.."
export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}"
TESTS=build-gpu/prebuilt/fmha_cuda_tests
mkdir -p build-gpu/prebuilt
python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
  .gpu/prebuilt/fmha_cuda_tests.xz "$TESTS" && chmod +x "$TESTS"
cat .gpu/prebuilt/revision.txt
start=$(date +%s)
timeout 260 "$TESTS" 2>&1 | grep -E "^\[ *(OK|FAILED|PASSED|RUN) *\]|tests ran|FAILED" > "$OUT/cuda-tests.txt"
echo "cuda tests exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
tail -n 2 "$OUT/cuda-tests.txt"; grep -c "^\[       OK" "$OUT/cuda-tests.txt"
BWD="CudaBackward.OddShapesAndHeadDims:CudaBackward.CausalBothAlignments:CudaBackward.Varlen"
BWD="$BWD:CudaBackward.BiasStagedTiles:CudaBackward.BiasRegisterForm:CudaBackward.WindowsAndFullyMaskedRows"
BWD="$BWD:CudaBackward.FusedAtBuckets64And128"
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 "$TESTS" --gtest_brief=1 \
    --gtest_filter="$BWD" > "$OUT/$tool.log" 2>&1
  echo "== $tool exit $?"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool.log" | tail -n 4
done
