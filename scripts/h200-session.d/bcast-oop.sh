#!/usr/bin/env bash
# The out-of-place broadcast of one chunk on one lane (13d6b8a: the root's own copy after its copy out,
# on the out lane) against the build before (ba4c075, the copy on the in lane beside it), one GPU,
# ranks on GPU 0: `migctl bench broadcast` 2 and 7 ranks, 8 KiB-512 KiB, out of place, interleaved
# twice, and in place once each (unchanged: no own copy). Then what DDP's buffer broadcasts cost:
# ResNet-18 b32 and b8, 7 ranks under MPS, with and without them (--no-broadcast-buffers), beside
# none and none --lockstep (the bound of ranks that wait for each other once a step).
# Build: make build lib; bin/migctl-old from ba4c075; carry ["bin/migctl", "bin/migctl-old",
# "bin/libmigctl.so"]. Output: $OUT/oop/. ~5 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init oop
bc() { coll "$1" "$2" "$3" broadcast -b 8KiB -e 512KiB -f 8 -n 300 -w 20 "${@:4}"; } # tag binary np [args]
newold bc
DDP_DEADLINE=${DDP_DEADLINE:-420}
for b in 32 8; do
  ddp "resnet$b-none" resnet $b none
  ddp "resnet$b-lockstep" resnet $b none --lockstep
  for i in 1 2; do
    ddp "resnet$b-migctl-$i" resnet $b migctl
    ddp "resnet$b-nobcast-$i" resnet $b migctl --no-broadcast-buffers
  done
done
