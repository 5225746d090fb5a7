#!/usr/bin/env bash
# Session 21 call 2: as call 1, plus `tma2` (the same, but the copying thread is the follower
# warpgroup's first, which also sets up the barriers, and no block barrier after the set-up),
# alternated twice; then tma2's digests.
cd "$(dirname "$0")/../../../.."
set -uf
cd .gpu/s21 && for i in 1 2; do for v in main tma tma2; do timeout 100 ./$v | grep -v digest; done; done
./tma2 | grep digest
