#!/usr/bin/env bash
# Pipeline chunk against message size for the host-staged all-reduce, 7 ranks on GPU 0 (the MIG path):
# `migctl bench allreduce` 1-64 MiB with --chunk 512KiB, 1MiB and 2MiB (the default at 7 ranks), two rounds
# interleaved; then DDP (ResNet-18 b32 and b8, GPT b4) with MIGCTL_TUNING=chunk=1MiB against the default,
# interleaved. Build: make build lib; carry ["bin/migctl", "bin/libmigctl.so"]. Output: $OUT/piece-grid/. ~5 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init piece-grid
timeout 60 $M bench limits -o json >"$W/limits.json" 2>&1
say "limits $(head -c 400 "$W/limits.json")"
for i in 1 2; do
  for c in 512KiB 1MiB 2MiB; do coll "c$c-$i" $M 7 allreduce -b 1MiB -e 64MiB -f 2 -n 30 -w 5 --chunk $c; done
done
DDP_DEADLINE=${DDP_DEADLINE:-330}
for i in 1 2; do
  ddp "r32-def-$i" resnet 32 migctl
  MIGCTL_TUNING=chunk=1MiB ddp "r32-c1-$i" resnet 32 migctl
  ddp "r8-def-$i" resnet 8 migctl
  MIGCTL_TUNING=chunk=1MiB ddp "r8-c1-$i" resnet 8 migctl
  ddp "g4-def-$i" gpt 4 migctl
  MIGCTL_TUNING=chunk=1MiB ddp "g4-c1-$i" gpt 4 migctl
done
