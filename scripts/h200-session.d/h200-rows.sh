#!/usr/bin/env bash
# A second sample of issue 11's rows that missed on an H200 (targets.sh, 2026-12-06 fourth session), in one
# call: the per-call probe beside the bench's 8-KiB row (twice, interleaved); ResNet-18 b32 with DDP's
# defaults against the lockstep bound, and with DDP's own knobs (10-MB buckets + gradient_as_bucket_view,
# no buffer broadcast), twice; the lockstep bounds of the communication-heavy rows (ResNet-18 b8, GPT b4),
# which free-running "none" runs overstate when the ranks drift apart under MPS. Build: make build lib;
# carry ["bin/migctl", "bin/libmigctl.so"]. Output: $OUT/h200-rows/{summary.txt,logs.tgz}. ~5 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init h200-rows
for i in 1 2; do
  ovh "default-$i"
  row "np7-8K-$i" 7 8KiB 2000 200
done
for i in 1 2; do
  ddp "resnet32-migctl-$i" resnet 32 migctl
  ddp "resnet32-lockstep-$i" resnet 32 none --lockstep
  ddp "resnet32-knobs-$i" resnet 32 migctl --bucket-mb 10 --bucket-view
  ddp "resnet32-nobcast-$i" resnet 32 migctl --no-broadcast-buffers
done
ddp resnet8-lockstep resnet 8 none --lockstep
ddp resnet8-migctl resnet 8 migctl
ddp resnet8-gloo resnet 8 gloo
ddp gpt4-lockstep gpt 4 none --lockstep
ddp gpt4-migctl gpt 4 migctl
ddp gpt4-migctl-10mb gpt 4 migctl --bucket-mb 10
