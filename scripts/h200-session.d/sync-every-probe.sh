#!/usr/bin/env bash
# What DDP's buffer broadcast costs when nothing makes the CPU wait at a step's end: ResNet-18 b32, 7 ranks on
# GPU 0, DDP with its gradients left unreduced (--probe-hook noop: every bucket's Future is complete at once), with
# and without the buffer broadcast (--no-broadcast-buffers), at --sync-every 5 and 1, interleaved over two rounds.
# If at K=5 the broadcast costs much less here than with migctl's all-reduces (1.5-2.6 ms in sync-every-bcast.sh),
# the CPU's wait for the last bucket is what exposes it. Build: make build lib; carry ["bin/migctl",
# "bin/libmigctl.so"]. Output: $OUT/sync-every-probe/. ~2.5 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init sync-every-probe
SE=(--steps 30 --sync-every 5)
for i in 1 2; do
  ddp "noop-k5-$i" resnet 32 migctl --probe-hook noop "${SE[@]}"
  ddp "noop-nobcast-k5-$i" resnet 32 migctl --probe-hook noop --no-broadcast-buffers "${SE[@]}"
  ddp "noop-k1-$i" resnet 32 migctl --probe-hook noop
  ddp "noop-nobcast-k1-$i" resnet 32 migctl --probe-hook noop --no-broadcast-buffers
done
ddp lockstep-k5 resnet 32 none --lockstep "${SE[@]}"
