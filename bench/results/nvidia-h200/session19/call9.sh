#!/usr/bin/env bash
# Session 19 call 9 (3db1cf3): Nsight Compute on the bias dQ (ping-pong) and dK/dV (lockstep) kernels
# of the timing tool at SAM-B, for where the bias backward's time goes, while the Python package
# installs; then the D 64 L 512 backward (causal and not) against FA2 and cuDNN in one process.
cd "$(dirname "$0")/../../../.."
set -uf
python3 -m pip install -q --no-build-isolation --no-deps . > "$OUT/pip-install.log" 2>&1 &
PIP=$!
for k in "backward_dq_kernel<.*PolicyBias" "backward_dkdv_kernel<.*PolicyBias"; do
  name=$(echo "$k" | cut -d'<' -f1)
  timeout 150 ncu --kernel-name-base demangled --kernel-name "regex:$k" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis \
    -f -o "$OUT/ncu-$name-bias" .gpu/s19/pp > "$OUT/ncu-$name-bias.log" 2>&1
  echo "== ncu $name exit $?"
  ncu -i "$OUT/ncu-$name-bias.ncu-rep" --page details > "$OUT/ncu-$name-bias.txt" 2>&1
  grep -E "Duration|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Ipc A|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|L2 Hit" "$OUT/ncu-$name-bias.txt" | head -n 12
done
wait $PIP; echo "pip exit $?"
for run in "standard --impls fmha,sdpa-flash,sdpa-cudnn --cases D64(.causal)?.L512$"; do
  set -- $run
  suite=$1; shift
  timeout 100 python3 -m fmha.bench --suite "$suite" "$@" --directions bwd --budget-ms 8 --no-plots \
    --out "$OUT/bench-$suite" > "$OUT/bench-$suite.log" 2>&1
  echo "== $suite exit $?"; cat "$OUT/bench-$suite/summary.txt"
done
