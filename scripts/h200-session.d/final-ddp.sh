#!/usr/bin/env bash
# The final build's DDP communication-heavy rows beside gloo, 7 ranks on GPU 0 under MPS:
# GPT b4 and ResNet-18 b8 (DDP's default buckets), migctl twice. Build: make build lib; carry ["bin"].
# Output: $OUT/finalddp/summary.txt. ~2 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init finalddp
ddp gpt4-migctl-1 gpt 4 migctl
ddp gpt4-gloo gpt 4 gloo
ddp resnet8-migctl-1 resnet 8 migctl
ddp resnet8-gloo resnet 8 gloo
ddp gpt4-migctl-2 gpt 4 migctl
ddp resnet8-migctl-2 resnet 8 migctl
