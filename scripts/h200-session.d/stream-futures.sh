#!/usr/bin/env bash
# Stream-ordered Futures (C ABI 8, migctl_order_stream) on one H200 under MPS: the stream-order checks
# with them on and off (python/tests/gpu_checks.py, 7 ranks), every op on CUDA tensors
# (ops_check.py), a killed rank under Futures that complete in stream order (kill_check.py --future:
# the survivors' streams released, the failure raised by the next call), and DDP ResNet-18 b8 / GPT b4
# with them on and off (MIGCTL_TORCH_STREAM_FUTURES=0), interleaved, beside gloo and none, plus one
# profiled migctl run (rank 0). Build: make build lib; carry ["bin"]. Output: $OUT/sfut/. ~6 minutes.
# Record of a call on a build with stream-ordered Futures (commit 33e326e, reverted after this call:
# DDP and ops_check hung, a stream waiting on the GPU for a host word can hold up the collective's
# own copies queued later behind it; see docs/results/collectives-h200.md, session of 2026-12-02 (2)).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init sfut
for v in 1 0; do
  MIGCTL_TORCH_STREAM_FUTURES=$v timeout 120 $M run --gpus 0 --np 7 -q --timeout 90s -- python3 python/tests/gpu_checks.py >"$W/gpu_checks-$v.out" 2>&1
  say "gpu_checks np=7 stream_futures=$v rc=$? $(grep -c '"failures": \[\]' "$W/gpu_checks-$v.out") ranks without failures; early=$(grep -o '"stream_future_early": [a-z]*' "$W/gpu_checks-$v.out" | sort | uniq -c | tr -s ' ' | paste -sd,)"
done
timeout 240 $M run --gpus 0 --np 7 -q --timeout 200s -- \
  python3 python/tests/ops_check.py --device cuda --sizes 0,7,65539 >"$W/ops7.out" 2>&1
say "ops_check cuda np=7 rc=$? $(grep -c '"failures": \[\]' "$W/ops7.out") ranks without failures; $(grep -o '"checks": [0-9]*' "$W/ops7.out" | head -1)"
MIGCTL_TIMEOUT=10s timeout 150 $M run --gpus 0 --np 3 --grace 90s -- \
  python3 python/tests/kill_check.py --device cuda --future --ignore-term >"$W/kill.out" 2>&1
say "kill_check cuda --future np=3 rc=$? survivors raised: $(grep -c '"raised": true' "$W/kill.out") of 2; $(grep -o '"step": [0-9]*, "error": "[^"]\{0,120\}' "$W/kill.out" | head -2 | paste -sd'|')"
DDP_DEADLINE=500
for i in 1 2; do
  ddp "resnet8-on-$i" resnet 8 migctl
  MIGCTL_TORCH_STREAM_FUTURES=0 ddp "resnet8-off-$i" resnet 8 migctl
  ddp "gpt4-on-$i" gpt 4 migctl
  MIGCTL_TORCH_STREAM_FUTURES=0 ddp "gpt4-off-$i" gpt 4 migctl
done
ddp resnet8-gloo resnet 8 gloo
ddp gpt4-gloo gpt 4 gloo
ddp resnet8-none resnet 8 none
ddp gpt4-none gpt 4 none
ddp resnet8-on-prof resnet 8 migctl --profile "$O/resnet8-on" --profile-ranks 0
