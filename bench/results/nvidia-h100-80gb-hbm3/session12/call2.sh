#!/usr/bin/env bash
# Session 12 call 2: fmha-bench A/B/C of the D 64 forward: main, the item restructure without
# persistence, and the persistent kernel that prefetches the next item after its last phase.
cd "$(dirname "$0")/probe"
cuda_root="$(dirname "$(command -v nvcc)")/.."
export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}"
for b in main restructured persistent; do
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" fmha-bench-$b.xz fmha-bench-$b && chmod +x fmha-bench-$b
done
nvidia-smi -L
for shape in "--b 32 --h 32 --lq 512" "--b 8 --h 32 --lq 2048" "--b 2 --h 32 --lq 8192" "--b 32 --h 32 --lq 512 --causal" "--b 2 --h 32 --lq 8192 --causal" "--b 8 --h 12 --lq 4096"; do
  for b in main restructured persistent main restructured persistent; do
    echo -n "D64 $shape $b: "
    timeout 60 ./fmha-bench-$b --device cuda --dtype bf16 --d 64 $shape --direction fwd --reps 50 | tail -1
  done
done
