#!/usr/bin/env bash
# Reproduces the committed benchmark tables (bench/results/<gpu>/) on a GPU machine: each suite in
# its own process and time limit, all peers in the same process as fmha. Installs the package
# first when it is not importable (as scripts/gpu-check.sh does).
#
#   bash scripts/bench-results.sh OUT_DIR [SUITE ...]     # default suites: standard memory features na
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-build-gpu/bench-results}
shift || true
SUITES=${*:-"standard memory features na"}
PEERS=fmha,sdpa-flash,sdpa-cudnn,sdpa-efficient
python3 -c "import fmha" 2>/dev/null ||
  FMHA_CUDA_ARCHITECTURES=${FMHA_CUDA_ARCHITECTURES:-90a-real} CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    python3 -m pip install -q --no-build-isolation --no-deps .

run() {  # suite, seconds, then the bench arguments
  local suite=$1 seconds=$2
  shift 2
  echo "== $suite: python -m fmha.bench --suite $suite $*"
  timeout "$seconds" python3 -m fmha.bench --suite "$suite" --out "$OUT_DIR/$suite" "$@" \
    >"$OUT_DIR/$suite.log" 2>&1
  echo "exit $?"
  [ -f "$OUT_DIR/$suite/summary.txt" ] && cat "$OUT_DIR/$suite/summary.txt"
}
mkdir -p "$OUT_DIR"
for suite in $SUITES; do
  case $suite in
    standard) run standard 230 --impls $PEERS --directions fwd,bwd --budget-ms 25 ;;
    memory) run memory 90 --impls fmha,sdpa-flash,sdpa-cudnn,sdpa-efficient,flex ;;
    features) run features ${FEATURES_SECONDS:-450} --impls $PEERS,flex,naive --directions fwd,bwd --budget-ms 25 \
                --cases 'rel-pos|bias|GQA|fp32|softcap|window' ;;
    na) run na ${NA_SECONDS:-480} --impls fmha,flex --directions fwd,bwd --budget-ms 25 ;;
    *) echo "unknown suite $suite" ;;
  esac
done
