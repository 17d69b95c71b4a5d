#!/usr/bin/env bash
# Does the completion thread's stream (results early on the device, MIGCTL_TUNING=complete=device) slow chained
# all-reduces by sharing a hardware queue with the library's lanes? chain_check.py --device cuda (36 chained
# all-reduces, 7 ranks on GPU 0; total_ms) early vs on the CPU, with CUDA_DEVICE_MAX_CONNECTIONS at its default (8)
# and at 32 (more hardware queues: fewer streams share one); then DDP ResNet-18 b32 at --sync-every 5, early with 32
# and 8 and the default path with 32. Build: make build lib; carry ["bin/migctl", "bin/libmigctl.so"]. Output:
# $OUT/connections/. ~2.5 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init connections
for i in 1 2; do
  MIGCTL_TUNING=complete=device check "chain-early-c8-$i" 7 60 python/tests/chain_check.py --device cuda
  MIGCTL_TUNING=complete=device CUDA_DEVICE_MAX_CONNECTIONS=32 check "chain-early-c32-$i" 7 60 python/tests/chain_check.py --device cuda
  check "chain-cpu-c8-$i" 7 60 python/tests/chain_check.py --device cuda
  [ "$i" = 1 ] && CUDA_DEVICE_MAX_CONNECTIONS=32 check "chain-cpu-c32-$i" 7 60 python/tests/chain_check.py --device cuda
done
SE=(--steps 30 --sync-every 5)
MIGCTL_TUNING=complete=device CUDA_DEVICE_MAX_CONNECTIONS=32 ddp resnet32-early-c32 resnet 32 migctl "${SE[@]}"
MIGCTL_TUNING=complete=device ddp resnet32-early-c8 resnet 32 migctl "${SE[@]}"
CUDA_DEVICE_MAX_CONNECTIONS=32 ddp resnet32-cpu-c32 resnet 32 migctl "${SE[@]}"
ddp resnet32-cpu-c8 resnet 32 migctl "${SE[@]}"
