#!/usr/bin/env bash
# Session 12 call 1: the persistent sm90 forward (plain / window policies, buckets 32 and 64).
# (1) fmha-bench A/B, main's forward against the persistent one (bucket 64 builds, same process order
#     alternated); (2) the whole CUDA suite on the prebuilt binary; (3) Python bench, forward, against
#     FA2 / cuDNN in one process.
cd "$(dirname "$0")/.."
cuda_root="$(dirname "$(command -v nvcc)")/.."
export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$OUT"
( cd .gpu/probe
  for b in main persistent; do
    python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" fmha-bench-$b.xz fmha-bench-$b && chmod +x fmha-bench-$b
  done
  nvidia-smi -L
  for shape in "--b 32 --h 32 --lq 512" "--b 16 --h 32 --lq 1024" "--b 8 --h 32 --lq 2048" "--b 2 --h 32 --lq 8192" "--b 32 --h 32 --lq 512 --causal" "--b 8 --h 32 --lq 2048 --causal" "--b 2 --h 32 --lq 8192 --causal" "--b 8 --h 12 --lq 4096"; do
    for b in main persistent main persistent; do
      echo -n "D64 $shape $b: "
      timeout 60 ./fmha-bench-$b --device cuda --dtype bf16 --d 64 $shape --direction fwd --reps 50 | tail -1
    done
  done ) 2>&1 | tee "$OUT/ab.txt"
export PREBUILT=.gpu/prebuilt STEPS="build cuda-tests bench" PIP_BUCKETS="64;128" BENCH_SECONDS=200
export BENCH_RUNS='standard|--cases ^D(64|128)(.causal)?.L(512|2048|8192)$ --impls fmha,sdpa-flash,sdpa-cudnn --directions fwd --budget-ms 8 --no-plots;features|--cases ^no-bias.*SAM-B --impls fmha,sdpa-flash,sdpa-cudnn --directions fwd --budget-ms 8 --no-plots'
bash scripts/gpu-check.sh
