#!/usr/bin/env bash
# The call signatures' cost, settled with more samples (2026-12-02, fifth part, call 2): 256 MiB at 2 and
# 7 ranks and 8 KiB at 7 ranks, each row beside the previous build's (bin/migctl-head: the session's
# starting commit, without signatures), interleaved; init_process_group's timeout under torch 2.x
# (timeout_check.py, a GPU job); issue 11's rows with this build (DDP migctl, gloo, lockstep).
# Build: make build lib; bin/migctl-head; carry ["bin"]. Output: $OUT/sigcost/{summary.txt,logs.tgz}.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init sigcost
for i in 1 2 3; do
  M=bin/migctl-head row r2-256M-old$i 2 256MiB 20 3
  row r2-256M-new$i 2 256MiB 20 3
done
for i in 1 2; do
  M=bin/migctl-head row r7-256M-old$i 7 256MiB 10 3
  row r7-256M-new$i 7 256MiB 10 3
  M=bin/migctl-head row r7-8K-old$i 7 8KiB 3000 300
  row r7-8K-new$i 7 8KiB 3000 300
done
timeout 60 $M run --gpus 0 --np 2 -q --timeout 60s -- python3 python/tests/timeout_check.py --timeout 2 >"$W/timeout.out" 2>&1
say "timeout_check (2 s, GPU job) rc=$? $(grep -o '"seconds": [0-9.]*, "error": "[^"]\{0,90\}' "$W/timeout.out" | head -1) failures: $(grep -o '"failures": \[[^]]*\]' "$W/timeout.out" | paste -sd' ')"
DDP_DEADLINE=520
ddp resnet32-lockstep resnet 32 none --lockstep
ddp resnet32-migctl resnet 32 migctl
ddp resnet8-lockstep resnet 8 none --lockstep
ddp resnet8-migctl resnet 8 migctl
ddp resnet8-gloo resnet 8 gloo
ddp gpt4-migctl gpt 4 migctl
ddp gpt4-gloo gpt 4 gloo
