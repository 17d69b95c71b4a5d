#!/usr/bin/env bash
# Pipeline step against message size for the host-staged all-reduce, 7 ranks on GPU 0 (the MIG path):
# `migctl bench allreduce` 1-64 MiB in whole chunks (--piece chunk) of 512KiB, 1MiB and 2MiB (the default
# chunk at 7 ranks), and the default (--piece auto: pieces of a half or a quarter of a chunk for calls of
# fewer than 16 chunks), two rounds interleaved; then DDP (ResNet-18 b32 and b8, GPT b4) by default against
# MIGCTL_TUNING=piece=chunk, interleaved; the 256-MiB row.
# Build: make build lib; carry ["bin/migctl", "bin/libmigctl.so"]. Output: $OUT/piece-grid/. ~5 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init piece-grid
timeout 60 $M bench limits -o json >"$W/limits.json" 2>&1
say "limits $(head -c 300 "$W/limits.json" | tr '\n' ' ')"
for i in 1 2; do
  coll "auto-$i" $M 7 allreduce -b 1MiB -e 64MiB -f 2 -n 30 -w 5
  for c in 512KiB 1MiB 2MiB; do coll "whole$c-$i" $M 7 allreduce -b 1MiB -e 64MiB -f 2 -n 30 -w 5 --chunk $c --piece chunk; done
done
DDP_DEADLINE=${DDP_DEADLINE:-330}
for i in 1 2; do
  ddp "r32-auto-$i" resnet 32 migctl
  MIGCTL_TUNING=piece=chunk ddp "r32-whole-$i" resnet 32 migctl
  ddp "r8-auto-$i" resnet 8 migctl
  MIGCTL_TUNING=piece=chunk ddp "r8-whole-$i" resnet 8 migctl
  ddp "g4-auto-$i" gpt 4 migctl
  MIGCTL_TUNING=piece=chunk ddp "g4-whole-$i" gpt 4 migctl
done
row n7-256M 7 256MiB 10 3
