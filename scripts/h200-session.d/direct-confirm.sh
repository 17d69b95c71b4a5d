#!/usr/bin/env bash
# Second look at libmigctl's direct migctl_run (the default on the gpu backend since this build) vs
# the dispatcher (MIGCTL_LIB_DIRECT_MAX=0), one H200 under MPS, CUDA tensors: the per-call probe
# interleaved with the 8 KiB bench rows at 7 ranks (x3), 2 and 1 rank; every op and dtype on CUDA
# tensors at 7 ranks (python/tests/ops_check.py); DDP ResNet-18 b8 and GPT b4 (migctl, gloo, none).
# Build: make build lib; carry ["bin"]. Output: $OUT/confirm/summary.txt. ~8 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init confirm
for i in 1 2 3; do
  row "r7-8K-$i" 7 8KiB 3000 300
  ovh "direct-$i"
  ovh "ring-$i" MIGCTL_LIB_DIRECT_MAX=0
done
row r2-8K 2 8KiB 3000 300
NP=2 ovh direct
NP=2 ovh ring MIGCTL_LIB_DIRECT_MAX=0
row r1-8K 1 8KiB 3000 300
NP=1 ovh direct
timeout 240 $M run --gpus 0 --np 7 -q --timeout 200s -- \
  python3 python/tests/ops_check.py --device cuda --sizes 0,7,65539 >"$W/ops7.out" 2>&1
say "ops_check cuda np=7 rc=$? $(grep -c '"failures": \[\]' "$W/ops7.out") ranks without failures; $(grep -o '"checks": [0-9]*' "$W/ops7.out" | head -1)"
DDP_DEADLINE=500
for i in 1 2; do
  ddp "resnet8-migctl-$i" resnet 8 migctl
  ddp "resnet8-migctl-10MB-$i" resnet 8 migctl --bucket-mb 10
done
ddp resnet8-gloo resnet 8 gloo
ddp resnet8-none resnet 8 none
ddp gpt4-migctl gpt 4 migctl
ddp gpt4-gloo gpt 4 gloo
ddp gpt4-none gpt 4 none
