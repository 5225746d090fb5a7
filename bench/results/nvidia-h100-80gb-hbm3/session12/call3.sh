#!/usr/bin/env bash
# Session 12 call 3: Nsight Compute on main's D 64 forward (fmha-bench, bucket-64 build), L 512 against
# L 8192: where the short rows lose (issue, stalls, tail). Prints the details page of each.
cd "$(dirname "$0")"
cuda_root="$(dirname "$(command -v nvcc)")/.."
export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/lib:${LD_LIBRARY_PATH:-}"
python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" fmha-bench-main.xz fmha-bench-main && chmod +x fmha-bench-main
for shape in "--b 32 --h 32 --lq 512" "--b 2 --h 32 --lq 8192"; do
  name=$(echo "$shape" | tr -d ' -')
  timeout 200 ncu --kernel-name regex:forward_kernel --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats \
    --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
    --section MemoryWorkloadAnalysis -f -o "$OUT/$name" \
    ./fmha-bench-main --device cuda --dtype bf16 --d 64 $shape --direction fwd --reps 5 >/dev/null 2>&1
  ncu -i "$OUT/$name.ncu-rep" --page details --csv > "$OUT/$name.details.csv"
  ncu -i "$OUT/$name.ncu-rep" --page raw --csv > "$OUT/$name.raw.csv"
  echo "== $shape"
  python3 - "$OUT/$name.details.csv" <<'PY'
import csv, sys
keep = ("Duration", "Elapsed Cycles", "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput",
        "Issue Slots Busy", "Issued Ipc Active", "No Eligible", "Active Warps Per Scheduler",
        "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction", "Executed Instructions",
        "L2 Hit Rate", "L1/TEX Hit Rate", "Registers Per Thread", "Waves Per SM", "Achieved Occupancy",
        "One or More Eligible", "Avg. Active Threads Per Warp")
for row in csv.DictReader(open(sys.argv[1])):
    if row.get("Metric Name") in keep:
        print(f'{row["Metric Name"]:42s} {row["Metric Value"]:>14s} {row["Metric Unit"]}')
PY
  python3 - "$OUT/$name.raw.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, units, vals = rows[0], rows[1], rows[2]
stalls = [(float(v.replace(',', '')), h) for h, v in zip(head, vals)
          if h.startswith("smsp__average_warp_latency_issue_stalled_") or
             (h.startswith("smsp__average_warps_issue_stalled_") and h.endswith("_per_issue_active.ratio"))]
for v, h in sorted(stalls, reverse=True)[:12]:
    print(f"{h:80s} {v:8.3f}")
PY
done
