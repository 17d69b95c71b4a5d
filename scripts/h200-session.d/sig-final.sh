#!/usr/bin/env bash
# The final signature layout (two generations, published after the fence) on a real H200 (2026-12-02,
# fifth part, call 6): mismatch_check.py on CUDA tensors, the capture check, and the cost rows again
# beside the session's starting build (bin/migctl-head), interleaved.
# Build: make build lib; bin/migctl-head; carry ["bin"] (no test binaries). Output: $OUT/sigfinal/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init sigfinal
for c in count coll; do
  timeout 90 $M run --gpus 0 --np 3 -q --timeout 60s -- python3 python/tests/mismatch_check.py --device cuda --case $c \
    >"$W/mismatch-$c.out" 2>&1
  say "mismatch cuda $c rc=$? raised: $(grep -c '"raised": true' "$W/mismatch-$c.out") of 3, clean: $(grep -c '"failures": \[\]' "$W/mismatch-$c.out")"
done
timeout 90 $M run --gpus 0 --np 2 -q --timeout 30s -- python3 python/tests/capture_check.py >"$W/capture.out" 2>&1
say "capture_check rc=$? clean: $(grep -c '"failures": \[\]' "$W/capture.out") of 2"
for i in 1 2; do
  M=bin/migctl-head row r2-256M-old$i 2 256MiB 20 3
  row r2-256M-new$i 2 256MiB 20 3
  M=bin/migctl-head row r7-8K-old$i 7 8KiB 3000 300
  row r7-8K-new$i 7 8KiB 3000 300
done
row r7-256M-new 7 256MiB 10 3
M=bin/migctl-head row r7-256M-old 7 256MiB 10 3
