#!/usr/bin/env bash
# Session 20 call 2 (3e10bf8: the dQ kernel overlapping the dK/dV kernel; the forward's tensor map
# not asked for empty dimensions): the whole CUDA suite on the test binary prebuilt at 3e10bf8
# (scripts/build-gpu-tests.sh; CudaBackward.PingPongManyTiles runs for the first time) while the
# Python package installs; then the SAM-B backward with and without the [1, H, L, L] bias against
# cuDNN in one process, with the overlap off (FMHA_DQ_OVERLAP=0) and on, twice each, alternated.
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
start=$(date +%s)
timeout 280 "$TESTS" 2>&1 | grep -E "^\[ *(OK|FAILED|PASSED|RUN) *\]|tests ran|FAILED" > "$OUT/cuda-tests.txt"
echo "cuda tests exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
tail -n 3 "$OUT/cuda-tests.txt"; grep -c "^\[       OK" "$OUT/cuda-tests.txt"
grep "PingPongManyTiles\|WindowsAndFullyMaskedRows" "$OUT/cuda-tests.txt"
wait $PIP; echo "pip exit $?"
for i in 1 2; do
  for overlap in 0 1; do
    FMHA_DQ_OVERLAP=$overlap timeout 100 python3 -m fmha.bench --suite features \
      --impls fmha,sdpa-cudnn --cases "^(bias|no-bias) .*SAM-B" --directions bwd --budget-ms 8 \
      --no-plots --out "$OUT/bench-features-overlap$overlap-run$i" > "$OUT/bench-overlap$overlap-run$i.log" 2>&1
    echo "== overlap $overlap run $i exit $?"; tail -n +2 "$OUT/bench-features-overlap$overlap-run$i/summary.txt"
  done
done
