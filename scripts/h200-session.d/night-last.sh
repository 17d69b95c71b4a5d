#!/usr/bin/env bash
# The night session's last call on one H200 (issues 9 and 11): the 256-MiB rows again (2 ranks three
# times: 12.6-13.1 ms in one call, 18.6 in the next), 8 KiB at 7 ranks, the PyTorch per-call
# overhead with ABI 5 (scripts/h200-session.d/torch-overhead2.sh), and every collective checked
# on the GPU with this build (scripts/gpu-collectives-check.sh: MPS, AVX2 sums, the one-lane spin).
# Needs bin/migctl, bin/libmigctl.so. Output: $OUT/last/summary.txt, logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init last
say "== 1. rows"
for i in 1 2 3; do row "r2-256M-$i" 2 256MiB 10 3; done
row r7-256M 7 256MiB 10 3
row r7-8K-1 7 8KiB 2000 200
row r7-8K-2 7 8KiB 2000 200
say "== 2. per-call overhead (torch-overhead2.sh)"
OUT=$W timeout 200 bash scripts/h200-session.d/torch-overhead2.sh >"$W/ovh2.txt" 2>&1
say "torch-overhead2 rc=$?"; tail -n 25 "$W/ovh2.txt" | tee -a "$S"
if [ $SECONDS -lt 420 ]; then
  say "== 3. every collective (bench defaults: MPS)"
  OUT=$W/check timeout $((560 - SECONDS)) bash scripts/gpu-collectives-check.sh >"$W/check.txt" 2>&1
  grep -E "FAIL|passed" "$W/check.txt" | tail -n 8 | tee -a "$S"
fi
