#!/usr/bin/env bash
# DDP's own knobs for jobs on MIG-like ranks (7 on GPU 0): bucket_cap_mb=10 and gradient_as_bucket_view
# together (--bucket-mb 10 --bucket-view) beside DDP's defaults, for migctl and gloo alike, on issue
# 11's four rows, with the lockstep bound of the compute-heavy ones. Call 5 of 2026-12-02's fourth part.
# Build: make build lib; carry ["bin"]. Output: $OUT/knobs2/{summary.txt,logs.tgz}. ~5 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init knobs2
DDP_DEADLINE=330
K="--bucket-mb 10 --bucket-view"
ddp resnet32-lockstep resnet 32 none --lockstep
ddp resnet32-migctl resnet 32 migctl
ddp resnet32-migctl-k resnet 32 migctl $K
ddp resnet32-gloo-k resnet 32 gloo $K
ddp gpt32-migctl-k gpt 32 migctl $K
ddp resnet8-migctl resnet 8 migctl
ddp resnet8-migctl-k resnet 8 migctl $K
ddp resnet8-gloo-k resnet 8 gloo $K
ddp gpt4-migctl gpt 4 migctl
ddp gpt4-migctl-k gpt 4 migctl $K
ddp gpt4-gloo-k gpt 4 gloo $K
ddp resnet32-migctl-k2 resnet 32 migctl $K
