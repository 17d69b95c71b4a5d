#!/usr/bin/env bash
# Where DDP's host-staged all-reduces reduce, 7 ranks on GPU 0 under MPS (the communication-heavy rows
# of issue 11 are CPU-bound: seven ranks launch kernels while each rank's reduce thread sums its share
# of every bucket; the link and the GPU have room). ResNet-18 b8 and GPT b4: none (the bound), migctl
# with MIGCTL_REDUCE_ON=cpu (default), gpu, split:0.5, a 20-us spin (less CPU spent waiting), gloo;
# then ResNet-18 b32 (compute-heavy) cpu vs gpu. Build: make build lib; carry ["bin/migctl",
# "bin/libmigctl.so"]. Output: $OUT/reduceon/summary.txt. ~6 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init reduceon
say "$(lscpu | grep -E '^(Model name|CPU\(s\)|NUMA node\(s\))' | tr -s ' ' | paste -sd ';')"
DDP_DEADLINE=${DDP_DEADLINE:-480}
for m in "resnet 8" "gpt 4"; do
  set -- $m; t=$1$2
  ddp "$t-none" $1 $2 none
  for i in 1 2; do
    MIGCTL_REDUCE_ON=cpu ddp "$t-cpu-$i" $1 $2 migctl
    MIGCTL_REDUCE_ON=gpu ddp "$t-gpu-$i" $1 $2 migctl
  done
  MIGCTL_REDUCE_ON=split:0.5 ddp "$t-split" $1 $2 migctl
  MIGCTL_TUNING=spin=20us ddp "$t-spin20" $1 $2 migctl
  ddp "$t-gloo" $1 $2 gloo
done
ddp resnet32-none resnet 32 none
MIGCTL_REDUCE_ON=cpu ddp resnet32-cpu resnet 32 migctl
MIGCTL_REDUCE_ON=gpu ddp resnet32-gpu resnet 32 migctl
