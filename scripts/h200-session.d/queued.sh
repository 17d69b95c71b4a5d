#!/usr/bin/env bash
# Copies back queued at once behind device waits (MIGCTL_TUNING=complete=queued, off by default): a chained
# all-reduce whose chunks fit the arena's slots (DDP's last ResNet-18 bucket, 8 chunks of 2 MiB) queues its copies
# out and, behind cuStreamWaitValue64 on each chunk's reduced flags, its copies back at the issue, and readies the
# caller then (migctl_wait_stream returns, the stream ordered after them) — where complete=device readies once the
# last chunk is reduced and the default once the copies back have ended. One call, ranks on GPU 0 (shm, MPS):
#  1. checks first (a wait on the wrong flag hangs or reads stale data): chain_check.py on CUDA tensors at 7 and 2
#     ranks with complete=queued (every element read through the current stream; the queued-back counter must
#     move), gpu_checks.py at 7 with it; chain_check's total_ms with queued, device and the default (the cost of
#     waits that may block a shared hardware queue);
#  2. DDP ResNet-18 b32 at DDP's defaults (the issue's row), interleaved over two rounds: default, device, queued,
#     with the lockstep bound; then at --sync-every 5; then ResNet-18 b8 and GPT b4, queued against the default.
# Build: make build lib; carry ["bin/migctl", "bin/libmigctl.so"]. Output: $OUT/queued/. ~8 min (DDP_DEADLINE
# 480 s by default).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init queued
say "host: $(lscpu | grep -E 'Model name' | sed 's/  */ /g')"
counts() { say "  $1 per rank: early $(grep -o '"early": [0-9]*' "$W/$1.out" | cut -d' ' -f2 | tr '\n' ' ')queued_back $(grep -o '"queued_back": [0-9]*' "$W/$1.out" | cut -d' ' -f2 | tr '\n' ' ')"; }
MIGCTL_TUNING=complete=queued check chain-queued-7 7 60 python/tests/chain_check.py --device cuda
counts chain-queued-7
if [ "$(grep -c '"failures": \[\]' "$W/chain-queued-7.out")" != 7 ]; then
  say "chain_check failed with complete=queued: no DDP A/B"; grep -h failures "$W/chain-queued-7.out" | head -3 | cut -c1-400 | tee -a "$S"
  SKIP_AB=1
fi
MIGCTL_TUNING=complete=queued check chain-queued-2 2 60 python/tests/chain_check.py --device cuda --calls 60
counts chain-queued-2
MIGCTL_TUNING=complete=queued check gpu-checks-queued-7 7 60 python/tests/gpu_checks.py
MIGCTL_TUNING=complete=device check chain-device-7 7 60 python/tests/chain_check.py --device cuda
check chain-cpu-7 7 60 python/tests/chain_check.py --device cuda
MIGCTL_TUNING=complete=queued check chain-queued-7b 7 60 python/tests/chain_check.py --device cuda
DDP_DEADLINE=${DDP_DEADLINE:-480}
[ -n "${SKIP_AB:-}" ] && DDP_DEADLINE=0
for i in 1 2; do
  ddp "resnet32-default-$i" resnet 32 migctl
  MIGCTL_TUNING=complete=device ddp "resnet32-device-$i" resnet 32 migctl
  MIGCTL_TUNING=complete=queued ddp "resnet32-queued-$i" resnet 32 migctl
  [ "$i" = 1 ] && ddp resnet32-lockstep resnet 32 none --lockstep
  # every broadcast on the CPU path: a peer there waiting for a root's device-written flag sleeps on a futex no
  # store wakes (up to 1 ms); if this is faster than queued, ranks mixing the paths cost that
  [ "$i" = 1 ] && MIGCTL_TUNING=complete=queued,bcast=cpu ddp resnet32-queued-bcpu resnet 32 migctl
done
SE=(--steps 30 --sync-every 5)
ddp resnet32-k5-default resnet 32 migctl "${SE[@]}"
MIGCTL_TUNING=complete=queued ddp resnet32-k5-queued resnet 32 migctl "${SE[@]}"
ddp resnet32-k5-lockstep resnet 32 none --lockstep "${SE[@]}"
MIGCTL_TUNING=complete=queued ddp resnet8-queued resnet 8 migctl
ddp resnet8-default resnet 8 migctl
MIGCTL_TUNING=complete=queued ddp gpt4-queued gpt 4 migctl
ddp gpt4-default gpt 4 migctl
