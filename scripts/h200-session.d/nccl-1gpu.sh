#!/usr/bin/env bash
# NCCL between "nodes" on one H200 (issue 9 item 4, issue 11's multi-node item): the real libnccl.so.2
# through internal/nccl (nccl-2node.sh: the one-rank check, then two nodes x 1 and x 2 ranks, all on
# GPU 0, one NCCL_HOSTID per node so NCCL joins them over its sockets on loopback), the PyTorch backend
# with MIGCTL_INTER_NODE=nccl between two nodes on GPU 0 (pytorch-fsdp.sh, NCCL_ONLY=1), then DDP rows
# of issue 11 on this host (7 ranks on GPU 0): ResNet-18 b32 bounds, default and 10-MB buckets, GPT b4.
# Build: make build lib; go test -c -ldflags='-s -w' -o bin/nccl.test ./internal/nccl; the same for
# bin/trainer.test ./trainer; carry ["bin"]. Output: $OUT/nccl1/{summary.txt,logs.tgz}. ~6 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init nccl1
OUT=$W timeout 200 bash scripts/h200-session.d/nccl-2node.sh 2>&1 | tee -a "$S"
say "nccl-2node rc=${PIPESTATUS[0]}"
OUT=$W NCCL_ONLY=1 timeout 120 bash scripts/h200-train.d/pytorch-fsdp.sh 2>&1 | tee -a "$S"
say "pytorch nccl rc=${PIPESTATUS[0]}"
DDP_DEADLINE=330
ddp resnet32-none resnet 32 none
ddp resnet32-lockstep resnet 32 none --lockstep
ddp resnet32-migctl resnet 32 migctl
ddp resnet32-migctl-b10 resnet 32 migctl --bucket-mb 10
ddp resnet32-migctl-view resnet 32 migctl --bucket-view
ddp resnet32-migctl-2 resnet 32 migctl
ddp gpt4-none gpt 4 none
ddp gpt4-migctl gpt 4 migctl
ddp gpt4-gloo gpt 4 gloo
