#!/usr/bin/env bash
# The four DDP rows of issue 11 (7 ranks on GPU 0 under MPS) beside two bounds: the issue's (none: the
# ranks train without communicating, each at its own pace) and a synchronous job's (none --lockstep:
# the same, with a barrier per step, so every step waits for the slowest rank); for ResNet-18 b32 also
# DDP without data (--probe-hook noop) with and without its per-forward buffer broadcast.
# Build: make build lib; carry ["bin"]. Output: $OUT/lockstep/{summary.txt,logs.tgz}. ~8 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init lockstep
DDP_DEADLINE=500
ddp resnet32-none resnet 32 none
ddp resnet32-lockstep resnet 32 none --lockstep
ddp resnet32-migctl resnet 32 migctl
ddp resnet32-gloo resnet 32 gloo
ddp resnet32-noop resnet 32 migctl --probe-hook noop
ddp resnet32-noop-nobuf resnet 32 migctl --probe-hook noop --no-broadcast-buffers
ddp resnet32-migctl-nobuf resnet 32 migctl --no-broadcast-buffers
ddp gpt32-none gpt 32 none
ddp gpt32-lockstep gpt 32 none --lockstep
ddp gpt32-migctl gpt 32 migctl
ddp gpt32-gloo gpt 32 gloo
ddp resnet8-none resnet 8 none
ddp resnet8-lockstep resnet 8 none --lockstep
ddp resnet8-migctl resnet 8 migctl
ddp resnet8-gloo resnet 8 gloo
ddp gpt4-none gpt 4 none
ddp gpt4-lockstep gpt 4 none --lockstep
ddp gpt4-migctl gpt 4 migctl
ddp gpt4-gloo gpt 4 gloo
ddp gpt32-migctl-2 gpt 32 migctl
ddp resnet32-lockstep-2 resnet 32 none --lockstep
