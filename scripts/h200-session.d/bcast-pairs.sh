#!/usr/bin/env bash
# Broadcast pairs without a fence (e9b0474: a one-chunk broadcast right after a fenced one stages into
# the other slot and waits for no one) against the build before (e8feee9), one GPU, ranks on GPU 0:
# `migctl bench broadcast` 7 ranks 8-64 KiB (back-to-back broadcasts: every other one now unfenced),
# then DDP (two buffer broadcasts per forward pass) 7 ranks under MPS, this library vs the one before,
# interleaved: ResNet-18 b32 (compute-heavy: issue 11 asks 90% of the no-communication bound) and b8,
# the noop hook at b32 (DDP without gradients: the broadcasts' own cost), GPT b4; none and gloo once.
# Build: make build lib; from e8feee9 bin/migctl-old and bin/libmigctl-old.so; tar czf bin/pack.tgz of
# the four (carry ["bin/pack.tgz"]: 64 MiB cap); the command unpacks it. Output: $OUT/pairs/. ~8 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init pairs
bc() { coll "$1" "$2" 7 broadcast -b 8KiB -e 64KiB -f 8 -n 300 -w 20; } # tag binary
for i in 1 2; do bc "bcast-new-$i" bin/migctl; bc "bcast-old-$i" bin/migctl-old; done
NEW=$PWD/bin/libmigctl.so OLD=$PWD/bin/libmigctl-old.so
DDP_DEADLINE=${DDP_DEADLINE:-470}
ddp resnet32-none resnet 32 none
for i in 1 2; do
  MIGCTL_LIB=$NEW ddp "resnet32-new-$i" resnet 32 migctl
  MIGCTL_LIB=$OLD ddp "resnet32-old-$i" resnet 32 migctl
done
MIGCTL_LIB=$NEW ddp resnet32-noop-new resnet 32 migctl --probe-hook noop
MIGCTL_LIB=$OLD ddp resnet32-noop-old resnet 32 migctl --probe-hook noop
ddp resnet8-none resnet 8 none
for i in 1 2; do
  MIGCTL_LIB=$NEW ddp "resnet8-new-$i" resnet 8 migctl
  MIGCTL_LIB=$OLD ddp "resnet8-old-$i" resnet 8 migctl
done
ddp resnet8-gloo resnet 8 gloo
MIGCTL_LIB=$NEW ddp gpt4-new gpt 4 migctl
MIGCTL_LIB=$OLD ddp gpt4-old gpt 4 migctl
ddp resnet32-gloo resnet 32 gloo
MIGCTL_LIB=$NEW ddp resnet32-new-b10 resnet 32 migctl --bucket-mb 10
