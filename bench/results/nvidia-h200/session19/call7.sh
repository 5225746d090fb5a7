#!/usr/bin/env bash
# Session 19 call 7: bench/cpp/sm90_backward_timing.cu (now also D 64 causal at L 512, B 32, H 32:
# call 6's D64 causal L512 backward ran at 0.96x FA2 with a p10-p90 of 0.73-1.14 ms) on main's
# kernels (19a9099, `main`) and on fef9e7f's (`pp`), both built on the development machine,
# alternated three times; then compute-sanitizer memcheck and racecheck over backward tests whose
# blocks walk many key tiles, one or none (odd shapes, causal rows without keys, empty varlen
# sequences, windows, the bias's staged and register forms) on the prebuilt test binary (fef9e7f).
cd "$(dirname "$0")/../../../.."
set -u
(cd .gpu/s19 && for i in 1 2 3; do for v in main pp; do timeout 90 ./$v; done; done)
nvidia-smi --query-gpu=name --format=csv,noheader
cuda_root="$(dirname "$(command -v nvcc)")/.."
export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}"
TESTS=build-gpu/prebuilt/fmha_cuda_tests
mkdir -p build-gpu/prebuilt
python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
  .gpu/prebuilt/fmha_cuda_tests.xz "$TESTS" && chmod +x "$TESTS"
BWD="CudaBackward.OddShapesAndHeadDims:CudaBackward.CausalBothAlignments:CudaBackward.Varlen"
BWD="$BWD:CudaBackward.BiasStagedTiles:CudaBackward.BiasRegisterForm:CudaBackward.WindowsAndFullyMaskedRows"
for tool in memcheck racecheck; do
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 1 "$TESTS" --gtest_brief=1 \
    --gtest_filter="$BWD" > "$OUT/$tool.log" 2>&1
  echo "== $tool exit $?"; grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool.log" | tail -n 4
done
