#!/usr/bin/env bash
# All-reduces in pieces (allreduce.PieceFor: quarter chunks for calls of at most slots/4 chunks) against whole
# chunks (--piece chunk, MIGCTL_TUNING=piece=chunk), 7 ranks on GPU 0 (the MIG path): `migctl bench allreduce`
# 1-64 MiB, two rounds interleaved; DDP (ResNet-18 b32 and b8, GPT b4) interleaved; the 256-MiB row.
# Call 2 of 2026-12-07 ran this script's first form (the first rule, and whole 512-KiB / 1-MiB chunks):
# docs/results/shm-2026-12-06.md, "Sixth session, call 2".
# Build: make build lib; carry ["bin/migctl", "bin/libmigctl.so"]. Output: $OUT/piece-grid/. ~4 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init piece-grid
timeout 60 $M bench limits -o json >"$W/limits.json" 2>&1
say "limits $(head -c 300 "$W/limits.json" | tr '\n' ' ')"
for i in 1 2; do
  coll "auto-$i" $M 7 allreduce -b 1MiB -e 64MiB -f 2 -n 30 -w 5
  coll "whole-$i" $M 7 allreduce -b 1MiB -e 64MiB -f 2 -n 30 -w 5 --piece chunk
done
DDP_DEADLINE=${DDP_DEADLINE:-330}
for i in 1 2; do
  for m in "r32 resnet 32" "r8 resnet 8" "g4 gpt 4"; do
    set -- $m
    ddp "$1-auto-$i" "$2" "$3" migctl
    MIGCTL_TUNING=piece=chunk ddp "$1-whole-$i" "$2" "$3" migctl
  done
done
row n7-256M 7 256MiB 10 3
