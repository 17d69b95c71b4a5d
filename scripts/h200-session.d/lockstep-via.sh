#!/usr/bin/env bash
# Why a synchronous job is slower than the issue's bound on the communication-heavy rows (call 2 of
# 2026-12-02's fourth part: GPT b4 none 17.0 ms, none --lockstep 39.4; ResNet-18 b8 10.3 vs 14.9):
# the lockstep bound with its per-step barrier over migctl (the library in every process) and over
# gloo (no migctl library), each twice, beside none; then DDP over migctl with GOMAXPROCS=2 (fewer Go
# threads per rank) beside the default. 7 ranks on GPU 0. Build: make build lib; carry ["bin"].
# Output: $OUT/lsvia/{summary.txt,logs.tgz}. ~5 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init lsvia
DDP_DEADLINE=330
for m in "gpt 4" "resnet 8"; do
  set -- $m
  for k in 1 2; do
    ddp "$1$2-none-$k" "$1" "$2" none
    ddp "$1$2-lockstep-migctl-$k" "$1" "$2" none --lockstep
    ddp "$1$2-lockstep-gloo-$k" "$1" "$2" none --lockstep --lockstep-via gloo
  done
done
ddp gpt4-migctl gpt 4 migctl
PIN="env GOMAXPROCS=2" ddp gpt4-migctl-gomaxprocs2 gpt 4 migctl
ddp resnet8-migctl resnet 8 migctl
PIN="env GOMAXPROCS=2" ddp resnet8-migctl-gomaxprocs2 resnet 8 migctl
