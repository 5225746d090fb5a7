#!/usr/bin/env bash
# Session 11 call 5: two dQ sum tiles used by turns in the fused kernel at D 64 (a step waits for the
# reductions of the step before last). Backward tests (both structures), then fused vs split timings.
cd "$(dirname "$0")/.."
PREBUILT=.gpu/prebuilt STEPS="build cuda-tests" CUDA_TESTS_FILTER="CudaBackward*" bash scripts/gpu-check.sh | tail -4
cd .gpu/probe
cuda_root="$(dirname "$(command -v nvcc)")/.."
export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}"
python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('fmha-bench-main.xz'), open('fmha-bench', 'wb'))" && chmod +x fmha-bench
for shape in "--b 8 --h 12 --lq 4096" "--b 32 --h 32 --lq 512" "--b 8 --h 32 --lq 2048" "--b 2 --h 32 --lq 8192" "--b 2 --h 32 --lq 8192 --causal" "--b 8 --h 32 --lq 2048 --causal"; do
  for impl in split fused; do
    echo -n "D64 $shape $impl: "
    ./fmha-bench --device cuda --dtype bf16 --d 64 $shape --direction bwd --backward-impl $impl --reps 30 | tail -1
  done
done
