#!/usr/bin/env bash
# Nsight Compute on the device machine: one launch of one fmha kernel of a bench/profile_kernels.py case,
# with the sections that say what limits it (speed of light, scheduler issue, warp stalls, instruction
# mix), a short table printed last, the report under $OUT for `ncu -i` later.
#
#   CASE=dense-d64 KERNEL=forward_kernel bash scripts/ncu-kernels.sh
#   CASE=na2d-k13 KERNEL=backward_dkdv BACKWARD=1 bash scripts/ncu-kernels.sh
# Needs the Python package installed (gpu-check's pip step, or `pip install .`).
set -uo pipefail
cd "$(dirname "$0")/.."
CASE=${CASE:-dense-d64}
KERNEL=${KERNEL:-forward_kernel}
OUT=${OUT:-$PWD/build-gpu}/ncu
mkdir -p "$OUT"
args=(--case "$CASE" --iters 1 --no-profiler)
[ -z "${BACKWARD:-}" ] && args+=(--forward-only)
report="$OUT/$CASE-$KERNEL"
# Two warm-up steps run first (profile_kernels.py); skip their launches of the kernel.
timeout "${NCU_SECONDS:-240}" ncu --kernel-name "regex:$KERNEL" --launch-skip "${SKIP:-2}" --launch-count 1 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats \
  --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
  --section SourceCounters --import-source yes -f -o "$report" \
  python3 bench/profile_kernels.py "${args[@]}" >"$OUT/$CASE-$KERNEL.log" 2>&1 || {
  echo "ncu failed:"; tail -n 20 "$OUT/$CASE-$KERNEL.log"; exit 1; }
ncu -i "$report.ncu-rep" --page details --csv >"$report.details.csv"
ncu -i "$report.ncu-rep" --page raw --csv >"$report.raw.csv"
# Per-instruction counts (SASS): where the issue slots go.
ncu -i "$report.ncu-rep" --page source --csv --print-source sass >"$report.sass.csv" 2>/dev/null ||
  ncu -i "$report.ncu-rep" --page source --csv >"$report.sass.csv" 2>/dev/null || true
# The same by CUDA source line (the kernels build with -lineinfo): which code the samples are in.
ncu -i "$report.ncu-rep" --page source --csv --print-source cuda >"$report.cuda.csv" 2>/dev/null ||
  rm -f "$report.cuda.csv"
python3 scripts/ncu_summary.py "$report"
