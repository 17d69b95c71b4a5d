#!/usr/bin/env bash
# Call 2 of 2026-12-02's fourth part: nccl-1gpu.sh's NCCL checks after the fix they found (a shared-
# memory root on /dev/shm for GPU ranks; NCCL's own debug lines kept), FSDP across two nodes with NCCL
# between them on GPU 0, then issue 11's four DDP rows on this host (7 ranks on GPU 0): none, lockstep,
# migctl, gloo, and 10-MB buckets (DDP's bucket_cap_mb, a user's knob) for both backends where the
# last bucket is what is exposed. Build as nccl-1gpu.sh. Output: $OUT/ncclt/{summary.txt,logs.tgz}.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init ncclt
OUT=$W timeout 200 bash scripts/h200-session.d/nccl-2node.sh 2>&1 | tee -a "$S"
say "nccl-2node rc=${PIPESTATUS[0]}"
OUT=$W NCCL_ONLY=1 timeout 150 bash scripts/h200-train.d/pytorch-fsdp.sh 2>&1 | tee -a "$S"
say "pytorch nccl rc=${PIPESTATUS[0]}"
DDP_DEADLINE=480
for row in "resnet 32" "gpt 32" "resnet 8" "gpt 4"; do
  set -- $row
  ddp "$1$2-none" "$1" "$2" none
  [ "$2" = 32 ] && [ "$1" = gpt ] || ddp "$1$2-lockstep" "$1" "$2" none --lockstep
  ddp "$1$2-migctl" "$1" "$2" migctl
  ddp "$1$2-gloo" "$1" "$2" gloo
  [ "$1$2" = gpt32 ] || ddp "$1$2-migctl-b10" "$1" "$2" migctl --bucket-mb 10
  [ "$2" -lt 32 ] && ddp "$1$2-gloo-b10" "$1" "$2" gloo --bucket-mb 10
done
