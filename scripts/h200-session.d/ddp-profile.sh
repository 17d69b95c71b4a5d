#!/usr/bin/env bash
# Where a DDP step's time goes, 7 ranks on GPU 0 under MPS: every op on CUDA tensors through the
# synchronous one-call paths (python/tests/ops_check.py, torch 2.x); the 8 KiB bench row beside the
# per-call probe; DDP ResNet-18 b8 and GPT b4 without communication (none), with DDP's own work but
# no data (--probe-hook noop), migctl (also with gradient_as_bucket_view), gloo; and torch.profiler
# traces (kernels, the library's copies) of 3 migctl steps on ranks 0 and 6 with MIGCTL_TRACE=1.
# Each DDP row reports the mean number of busy CPUs and each rank's CPU time per step.
# Build: make build lib; carry ["bin"]. Output: $OUT/ddpprof/{summary.txt,logs.tgz,*.json.gz}. ~9 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init ddpprof
timeout 240 $M run --gpus 0 --np 7 -q --timeout 200s -- \
  python3 python/tests/ops_check.py --device cuda --sizes 0,7,65539 >"$W/ops7.out" 2>&1
say "ops_check cuda np=7 rc=$? $(grep -c '"failures": \[\]' "$W/ops7.out") ranks without failures; $(grep -o '"checks": [0-9]*' "$W/ops7.out" | head -1)"
row r7-8K 7 8KiB 3000 300
ovh direct
DDP_DEADLINE=500
ddp resnet8-none resnet 8 none
ddp resnet8-noop resnet 8 migctl --probe-hook noop
ddp resnet8-migctl resnet 8 migctl
ddp resnet8-migctl-view resnet 8 migctl --bucket-view
ddp resnet8-gloo resnet 8 gloo
MIGCTL_TRACE=1 ddp resnet8-migctl-prof resnet 8 migctl --profile "$O/resnet8-migctl" --profile-ranks 0,6
ddp resnet8-none-prof resnet 8 none --profile "$O/resnet8-none" --profile-ranks 0
ddp gpt4-none gpt 4 none
ddp gpt4-noop gpt 4 migctl --probe-hook noop
ddp gpt4-migctl gpt 4 migctl
ddp gpt4-migctl-view gpt 4 migctl --bucket-view
ddp gpt4-gloo gpt 4 gloo
MIGCTL_TRACE=1 ddp gpt4-migctl-prof gpt 4 migctl --profile "$O/gpt4-migctl" --profile-ranks 0,6
ddp resnet8-sync resnet 8 migctl --probe-hook sync
