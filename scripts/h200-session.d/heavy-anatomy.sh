#!/usr/bin/env bash
# The compute-heavy DDP rows of issue 11 (ResNet-18 b32, GPT b32; 7 ranks on GPU 0 under MPS), taken
# apart: no communication (none), DDP without data (--probe-hook noop), with one-element all-reduces
# (sync), migctl, gloo; the CPU waiting for the GPU by sleeping instead of spinning (--cuda-sched
# blocking); GPT with 10-MB buckets; torch.profiler traces of rank 0 (migctl with MIGCTL_TRACE=1, and
# none), summarised by examples/pytorch/profile_summary.py into the summary.
# Build: make build lib; carry ["bin"]. Output: $OUT/heavy/{summary.txt,logs.tgz,*.json.gz}. ~8 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init heavy
nproc >>"$S"
DDP_DEADLINE=470
ddp resnet32-none resnet 32 none
ddp resnet32-migctl resnet 32 migctl
ddp resnet32-gloo resnet 32 gloo
ddp resnet32-noop resnet 32 migctl --probe-hook noop
ddp resnet32-sync resnet 32 migctl --probe-hook sync
ddp resnet32-migctl-blocking resnet 32 migctl --cuda-sched blocking
ddp resnet32-none-blocking resnet 32 none --cuda-sched blocking
MIGCTL_TRACE=1 ddp resnet32-migctl-prof resnet 32 migctl --profile "$O/resnet32-migctl" --profile-ranks 0
ddp resnet32-none-prof resnet 32 none --profile "$O/resnet32-none" --profile-ranks 0
ddp gpt32-none gpt 32 none
ddp gpt32-migctl gpt 32 migctl
ddp gpt32-gloo gpt 32 gloo
ddp gpt32-noop gpt 32 migctl --probe-hook noop
ddp gpt32-migctl-blocking gpt 32 migctl --cuda-sched blocking
MIGCTL_TRACE=1 ddp gpt32-migctl-prof gpt 32 migctl --profile "$O/gpt32-migctl" --profile-ranks 0
ddp gpt32-migctl-b10 gpt 32 migctl --bucket-mb 10
ddp gpt32-sync gpt 32 migctl --probe-hook sync
for f in "$O"/*.rank0.json.gz; do
  [ -e "$f" ] || continue
  echo "== $(basename "$f")" >>"$S"
  timeout 60 python3 examples/pytorch/profile_summary.py "$f" --gap 0.5 --ops 6 >>"$S" 2>&1
done
for f in "$W"/*migctl-prof.err; do echo "== $f (tail)" >>"$S"; tail -n 45 "$f" >>"$S"; done
