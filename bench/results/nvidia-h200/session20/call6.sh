#!/usr/bin/env bash
# Session 20 call 6 (final code, the test binary prebuilt at 455a322): racecheck over call 4's
# backward list again with a longer limit (call 4's 150 seconds cut it off mid-way; memcheck had
# passed), while the Python package installs; then the SAM-B backward with and without the
# [1, H, L, L] bias, fused and split, against cuDNN in one process.
cd "$(dirname "$0")/../../../.."
set -uf
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps . > "$OUT/pip-install.log" 2>&1 &
PIP=$!
cuda_root="$(dirname "$(command -v nvcc)")/.."
export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}"
TESTS=build-gpu/prebuilt/fmha_cuda_tests
mkdir -p build-gpu/prebuilt
python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
  .gpu/prebuilt/fmha_cuda_tests.xz "$TESTS" && chmod +x "$TESTS"
cat .gpu/prebuilt/revision.txt
BWD="CudaBackward.OddShapesAndHeadDims:CudaBackward.CausalBothAlignments:CudaBackward.Varlen"
BWD="$BWD:CudaBackward.BiasStagedTiles:CudaBackward.BiasRegisterForm:CudaBackward.WindowsAndFullyMaskedRows"
BWD="$BWD:CudaBackward.FusedAtBuckets64And128:CudaBackward.GradientsCompleteForWorkQueuedBehind"
BWD="$BWD:CudaForward.WindowsAndFullyMaskedRows"
start=$(date +%s)
timeout 400 compute-sanitizer --tool racecheck --error-exitcode 1 "$TESTS" --gtest_filter="$BWD" \
  > "$OUT/racecheck.log" 2>&1
echo "== racecheck exit $? after $(( $(date +%s) - start )) s"
grep -E "^\[ +(OK|FAILED|PASSED) +\]|RACECHECK SUMMARY" "$OUT/racecheck.log" | tail -n 14
gzip "$OUT/racecheck.log"
wait $PIP; echo "pip exit $?"
timeout 120 python3 -m fmha.bench --suite features --impls fmha,sdpa-cudnn --backward-impl both \
  --directions bwd --cases "^(bias|no-bias).*SAM-B" --budget-ms 8 --no-plots \
  --out "$OUT/fused-vs-split" > "$OUT/fused-vs-split.log" 2>&1
echo "== bench exit $?"; grep "^| " "$OUT/fused-vs-split/features.md"
