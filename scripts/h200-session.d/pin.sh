#!/usr/bin/env bash
# Does binding each rank to its own CPUs help on a shared GPU? One H200, 7 ranks on GPU 0 under MPS:
# the PyTorch per-call probe (python/tests/overhead_check.py, with the scheduler's view of each
# rank: run-queue waits and preemptions per call) and DDP (ResNet-18 b8, GPT b4), each unbound and
# bound (scripts/h200-session.d/pin_rank.py: 2 of the 16 CPUs per rank), gloo and no communication
# beside them; 8 KiB bench rows for the per-call reference. Issue 11's rows.
# Build: make build lib; cp ../shared/bench/gloo_allreduce.py bin/; carry ["bin"].
# Output: $OUT/pin/summary.txt. ~7 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init pin
lscpu | grep -E '^(CPU\(s\)|Thread|Core|Socket|NUMA|Model name|L3)' >>"$S"
P="python3 scripts/h200-session.d/pin_rank.py"
row r7-8K-1 7 8KiB 3000 300
PIN= ovh free-1
PIN=$P ovh pinned-1
row r7-8K-2 7 8KiB 3000 300
PIN=$P ovh pinned-2
PIN= ovh free-2
for b in migctl gloo none; do
  PIN= ddp "resnet8-$b-free" resnet 8 $b
  PIN=$P ddp "resnet8-$b-pinned" resnet 8 $b
done
for b in migctl gloo; do
  PIN= ddp "gpt4-$b-free" gpt 4 $b
  PIN=$P ddp "gpt4-$b-pinned" gpt 4 $b
done
PIN=$P ddp resnet8-migctl-pinned-2 resnet 8 migctl
PIN= ddp resnet8-migctl-free-2 resnet 8 migctl
