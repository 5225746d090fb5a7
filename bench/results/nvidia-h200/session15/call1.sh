#!/usr/bin/env bash
# Session 15 call 1 (H200): main's sm90 forward (f93b1e6) with temporary ablation hooks, built here
# from .gpu/ablate/fwd_ablate.cu (now bench/cpp/sm90_forward_timing.cu) once per hook, -DFMHA_FWD_ABLATE=:
#   0 main; 1 no K/V copies once every stage was filled (load_group skipped for groups >= 2 x
#   stages); 3 exp2 replaced by a multiply (softmax_update); 4 softmax_update skipped.
# The hooks were not kept (docs/perf-log.md, session 15).
cd "$(dirname "$0")/../../../.."
cd .gpu/ablate
for b in fwd_ablate_d64_0 fwd_ablate_d64_1 fwd_ablate_d64_3 fwd_ablate_d64_4 fwd_ablate_d64_0 \
         fwd_ablate_d128_0 fwd_ablate_d128_1 fwd_ablate_d128_4; do
  ./$b || echo FAIL $b
done 2>&1 | tee "$OUT/ablate.txt"
