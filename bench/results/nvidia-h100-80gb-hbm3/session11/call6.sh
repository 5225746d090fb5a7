#!/usr/bin/env bash
# Session 11 call 6 (experiment): the D 64 forward with one warpgroup a block (64 rows, two blocks an
# SM, no ping-pong) against main's two warpgroups (128 rows, one block an SM, ping-pong). fmha-bench.
# Ran as .gpu/s11call6.sh, with the two stripped, xz-packed fmha-bench builds in .gpu/probe.
cd "$(dirname "$0")/probe"
cuda_root="$(dirname "$(command -v nvcc)")/.."
export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}"
for b in main 1wg; do
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" fmha-bench-$b.xz fmha-bench-$b && chmod +x fmha-bench-$b
done
nvidia-smi -L
for shape in "--b 32 --h 32 --lq 512" "--b 16 --h 32 --lq 1024" "--b 8 --h 32 --lq 2048" "--b 2 --h 32 --lq 8192" "--b 32 --h 32 --lq 512 --causal" "--b 8 --h 32 --lq 2048 --causal" "--b 2 --h 32 --lq 8192 --causal" "--b 8 --h 12 --lq 4096"; do
  for b in main 1wg main 1wg; do
    echo -n "D64 $shape $b: "
    ./fmha-bench-$b --device cuda --dtype bf16 --d 64 $shape --direction fwd --reps 50 | tail -1
  done
done
