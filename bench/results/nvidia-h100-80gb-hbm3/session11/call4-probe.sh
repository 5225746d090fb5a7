#!/usr/bin/env bash
# Session 11 probe: the fused backward's dQ adds as reductions (0), plain bulk copies (1), none (2).
cd "$(dirname "$0")"
cuda_root="$(dirname "$(command -v nvcc)")/.."
export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}"
python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('fmha-bench.xz'), open('fmha-bench', 'wb'))" && chmod +x fmha-bench
nvidia-smi -L
for shape in "--b 8 --h 12 --lq 4096" "--b 2 --h 32 --lq 8192" "--b 2 --h 32 --lq 8192 --causal"; do
  echo "== $shape D64 bf16 bwd"
  ./fmha-bench --device cuda --dtype bf16 --d 64 $shape --direction bwd --backward-impl split --reps 30 | tail -1
  for mode in 0 1 2; do
    echo -n "fused probe $mode: "
    FMHA_PROBE_FUSED_DQ=$mode ./fmha-bench --device cuda --dtype bf16 --d 64 $shape --direction bwd --backward-impl fused --reps 30 | tail -1
  done
done
