#!/usr/bin/env bash
# Session 22 call 5: the sm90 fp32 backward by part (planes passes, dK/dV kernel, dQ kernel; kernel
# only, bench/cpp/sm90_fp32_timing.cu), then Nsight Compute on one launch of each kernel at issue
# 4's fp32 case (speed of light, scheduler, warp stalls; the tool's first four launches of each
# kernel are its small checks).
cd "$(dirname "$0")/../../../.."
set -u
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p .gpu/s22/bin "$OUT/ncu"
nvcc -std=c++17 --expt-relaxed-constexpr -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
  -o .gpu/s22/bin/fp32 bench/cpp/sm90_fp32_timing.cu src/cuda/workspace_pool.cu -lcuda
.gpu/s22/bin/fp32
for k in backward_dkdv_fp32 backward_dq_fp32; do
  report="$OUT/ncu/$k"
  ncu --kernel-name "regex:$k" --launch-skip 4 --launch-count 1 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats \
    --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
    --section MemoryWorkloadAnalysis --section SourceCounters --import-source yes -f -o "$report" \
    .gpu/s22/bin/fp32 >"$report.log" 2>&1 || tail -n 5 "$report.log"
  ncu -i "$report.ncu-rep" --page details --csv >"$report.details.csv"
  ncu -i "$report.ncu-rep" --page raw --csv >"$report.raw.csv"
  ncu -i "$report.ncu-rep" --page source --csv --print-source sass >"$report.sass.csv" 2>/dev/null || true
  ncu -i "$report.ncu-rep" --page source --csv --print-source cuda >"$report.cuda.csv" 2>/dev/null || true
  python3 scripts/ncu_summary.py "$report" | tail -n 40
done
