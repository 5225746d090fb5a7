#!/usr/bin/env bash
# Session 14 call 5 (H200): head sections against head-by-head order on the same machine, one
# process each (FMHA_HEAD_SECTIONS=0 turns them off): the dense grid of issue 4 and the SAM shapes,
# then the L 512 cells once more each way. The Python package alone (buckets 64;96;128;256).
cd "$(dirname "$0")/../../../.."
set -u
START=$(date +%s)
left() { echo $(( ${1:-580} - ($(date +%s) - START) )); }
mkdir -p "$OUT/logs"
trap 'tar -czf "$OUT/call.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"' EXIT
FMHA_CUDA_ARCHITECTURES=90a-real FMHA_HEAD_DIM_BUCKETS="64;96;128;256" CMAKE_BUILD_PARALLEL_LEVEL=16 \
  python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/logs/pip.log" 2>&1 ||
  { echo "pip install failed"; tail -n 30 "$OUT/logs/pip.log"; exit 1; }
echo "installed after $(( $(date +%s) - START )) s"
std="--impls fmha,sdpa-flash --directions fwd,bwd --budget-ms 8 --no-plots"
run() {  # name, sections (1/0), suite, extra arguments
  local name=$1 on=$2 suite=$3; shift 3
  if [ "$on" = 1 ]; then env -u FMHA_HEAD_SECTIONS timeout "$(left 585)" python3 -m fmha.bench --suite "$suite" --out "$OUT/logs/$name" "$@" >"$OUT/logs/$name.log" 2>&1
  else FMHA_HEAD_SECTIONS=0 timeout "$(left 585)" python3 -m fmha.bench --suite "$suite" --out "$OUT/logs/$name" "$@" >"$OUT/logs/$name.log" 2>&1; fi
  echo "$name exit $? after $(( $(date +%s) - START )) s"
}
run std-on 1 standard $std --cases 'D(64|128|256)(.causal)?.L(512|2048|8192)$'
run std-off 0 standard $std --cases 'D(64|128|256)(.causal)?.L(512|2048|8192)$'
run sam-on 1 features --impls fmha,sdpa-cudnn --directions fwd,bwd --budget-ms 8 --no-plots --cases 'SAM'
run sam-off 0 features --impls fmha,sdpa-cudnn --directions fwd,bwd --budget-ms 8 --no-plots --cases 'SAM'
run l512-off 0 standard $std --cases 'L512$'
run l512-on 1 standard $std --cases 'L512$'
