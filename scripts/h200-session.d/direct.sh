#!/usr/bin/env bash
# migctl_run on the calling thread (libmigctl's direct run, MIGCTL_LIB_DIRECT_MAX) vs through the
# dispatcher, one H200, CUDA tensors under MPS: the PyTorch per-call probe at 7, 2 and 1 ranks
# (interleaved, the 8 KiB bench rows beside them: issue 11's <= 20 us row), the CUDA checks of
# python/tests/gpu_checks.py with direct runs at 7 ranks; then DDP bucket sizes under MPS
# (ResNet-18 b8, GPT b4; migctl, gloo).
# Build: make build lib; carry ["bin"]. Output: $OUT/direct/summary.txt. ~8 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init direct
row r7-8K-1 7 8KiB 3000 300
ovh direct-1
ovh ring-1 MIGCTL_LIB_DIRECT_MAX=0
ovh direct-2
ovh ring-2 MIGCTL_LIB_DIRECT_MAX=0
ovh ring-spin MIGCTL_LIB_DIRECT_MAX=0 MIGCTL_LIB_RUN_SPIN_MAX_US=200
row r7-8K-2 7 8KiB 3000 300
row r2-8K 2 8KiB 3000 300
NP=2 ovh direct
NP=2 ovh ring MIGCTL_LIB_DIRECT_MAX=0
row r1-8K 1 8KiB 3000 300
NP=1 ovh direct
NP=1 ovh ring MIGCTL_LIB_DIRECT_MAX=0
timeout 240 $M run --gpus 0 --np 7 -q --timeout 120s -- python3 python/tests/gpu_checks.py >"$W/gpu_checks.out" 2>&1
say "gpu_checks np=7 (direct runs) rc=$? $(grep -c '"failures": \[\]' "$W/gpu_checks.out") ranks without failures"
DDP_DEADLINE=520
ddp resnet8-migctl-25 resnet 8 migctl
ddp resnet8-gloo-25 resnet 8 gloo
ddp resnet8-migctl-10 resnet 8 migctl --bucket-mb 10
ddp resnet8-migctl-5 resnet 8 migctl --bucket-mb 5
ddp resnet8-gloo-10 resnet 8 gloo --bucket-mb 10
ddp gpt4-migctl-25 gpt 4 migctl
ddp gpt4-migctl-10 gpt 4 migctl --bucket-mb 10
ddp gpt4-gloo-25 gpt 4 gloo
ddp resnet8-none resnet 8 none
