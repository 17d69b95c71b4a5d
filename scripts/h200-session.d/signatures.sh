#!/usr/bin/env bash
# Call signatures and failing Futures on a real H200 (2026-12-02, fifth part): ranks whose calls differ
# raise on CUDA tensors (mismatch_check.py: a count, the collective, a DDP model's shapes); a rank
# killed mid-DDP makes both survivors raise from backward (kill_check.py --ddp), not crash; the CUDA
# checks (gpu_checks.py, ops_check.py) with the Futures now made by then(); the cost of the signature
# on 8 KiB, 256 MiB rows, each beside the same row of the previous build (bin/migctl-head, built from
# the session's starting commit); DDP rows (migctl beside gloo, ranks identical).
# Build: make build lib; bin/migctl-head; carry ["bin"]. Output: $OUT/sig/{summary.txt,logs.tgz}.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init sig
for c in count coll ddp; do
  timeout 90 $M run --gpus 0 --np 3 -q --timeout 60s -- python3 python/tests/mismatch_check.py --device cuda --case $c \
    >"$W/mismatch-$c.out" 2>&1
  say "mismatch cuda $c rc=$? raised: $(grep -c '"raised": true' "$W/mismatch-$c.out") of 3, clean: $(grep -c '"failures": \[\]' "$W/mismatch-$c.out"); $(grep -o '"seconds": [0-9.]*' "$W/mismatch-$c.out" | paste -sd' ')"
done
MIGCTL_TIMEOUT=10s timeout 100 $M run --gpus 0 --np 3 --grace 60s -- \
  python3 python/tests/kill_check.py --device cuda --ddp --ignore-term >"$W/kill-ddp.out" 2>&1
say "kill_check cuda --ddp np=3 rc=$? survivors raised: $(grep -c '"raised": true' "$W/kill-ddp.out") of 2; segfaults: $(grep -ci 'segmentation\|SIGSEGV' "$W/kill-ddp.out")"
MIGCTL_TIMEOUT=10s timeout 100 $M run --gpus 0 --np 3 --grace 60s -- \
  python3 python/tests/kill_check.py --device cuda --future --ignore-term >"$W/kill-future.out" 2>&1
say "kill_check cuda --future np=3 rc=$? survivors raised: $(grep -c '"raised": true' "$W/kill-future.out") of 2"
timeout 100 $M run --gpus 0 --np 7 -q --timeout 80s -- python3 python/tests/gpu_checks.py >"$W/gpu_checks.out" 2>&1
say "gpu_checks np=7 rc=$? $(grep -c '"failures": \[\]' "$W/gpu_checks.out") ranks without failures"
timeout 200 $M run --gpus 0 --np 7 -q --timeout 180s -- \
  python3 python/tests/ops_check.py --device cuda --sizes 0,7,65539 >"$W/ops7.out" 2>&1
say "ops_check cuda np=7 rc=$? $(grep -c '"failures": \[\]' "$W/ops7.out") ranks without failures; $(grep -o '"checks": [0-9]*' "$W/ops7.out" | head -1)"
# The signature's cost: each row beside the previous build's.
for i in 1 2; do
  row r7-8K-new$i 7 8KiB 3000 300
  M=bin/migctl-head row r7-8K-old$i 7 8KiB 3000 300
done
row r7-256M-new 7 256MiB 10 3
M=bin/migctl-head row r7-256M-old 7 256MiB 10 3
row r2-256M-new 2 256MiB 20 3
M=bin/migctl-head row r2-256M-old 2 256MiB 20 3
DDP_DEADLINE=480
ddp gpt4-migctl gpt 4 migctl
ddp gpt4-gloo gpt 4 gloo
ddp resnet8-migctl resnet 8 migctl
ddp resnet32-migctl resnet 32 migctl
