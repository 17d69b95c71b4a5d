#!/usr/bin/env bash
# Issue 11's table with this session's final build (2026-12-02, fifth part, call 5): DDP ResNet-18 and the
# small GPT at the compute- and communication-heavy batches, 7 ranks on GPU 0, backend migctl beside gloo,
# the no-communication run (none) and the synchronous bound (none --lockstep), slowest rank's median step.
# Build: make build lib; carry ["bin"]. Output: $OUT/finalrows/{summary.txt,logs.tgz}.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init finalrows
DDP_DEADLINE=540
ddp resnet32-lockstep resnet 32 none --lockstep
ddp resnet32-migctl resnet 32 migctl
ddp resnet32-gloo resnet 32 gloo
ddp resnet8-lockstep resnet 8 none --lockstep
ddp resnet8-none resnet 8 none
ddp resnet8-migctl resnet 8 migctl
ddp resnet8-gloo resnet 8 gloo
ddp gpt4-lockstep gpt 4 none --lockstep
ddp gpt4-none gpt 4 none
ddp gpt4-migctl gpt 4 migctl
ddp gpt4-gloo gpt 4 gloo
ddp gpt32-none gpt 32 none
ddp gpt32-migctl gpt 32 migctl
ddp gpt32-gloo gpt 32 gloo
