#!/usr/bin/env bash
# The session's final build (stream-ordered Futures reverted) on one H200: stream-order checks at 7
# ranks with the new Future check (python/tests/gpu_checks.py), a killed rank on CUDA tensors through
# get_future().wait() (kill_check.py --device cuda --future), one DDP ResNet-18 b8 run over migctl.
# Build: make build lib; carry ["bin"]. Output: $OUT/final2/summary.txt. ~2 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init final2
timeout 100 $M run --gpus 0 --np 7 -q --timeout 80s -- python3 python/tests/gpu_checks.py >"$W/gpu_checks.out" 2>&1
say "gpu_checks np=7 rc=$? $(grep -c '"failures": \[\]' "$W/gpu_checks.out") ranks without failures"
MIGCTL_TIMEOUT=10s timeout 100 $M run --gpus 0 --np 3 --grace 60s -- \
  python3 python/tests/kill_check.py --device cuda --future --ignore-term >"$W/kill.out" 2>&1
say "kill_check cuda --future np=3 rc=$? survivors raised: $(grep -c '"raised": true' "$W/kill.out") of 2; $(grep -o '"step": [0-9]*, "error": "[^"]\{0,100\}' "$W/kill.out" | head -2 | paste -sd'|')"
ddp resnet8-migctl resnet 8 migctl
