#!/usr/bin/env bash
# Issue 11's table on one H200 (7 ranks on GPU 0, the MIG path: shm, host-staged), run by
# scripts/h200-train.sh with ONLY=pytorch-compare: DDP ResNet-18 and the small GPT at a compute-
# and a communication-heavy batch, backend migctl vs gloo vs none (no communication: the bound),
# then FSDP vs DDP losses of the GPT over migctl. Last line: a verdict count.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${OUT:-./pytorch-compare-out}; mkdir -p "$R"
export MIGCTL_LIB=$PWD/bin/libmigctl.so
# lockstep (a fourth backend of compare.sh) left out: the table fits the call this way
BACKENDS=${BACKENDS:-"migctl gloo none"} NP=7 GPUS=0 STEPS=${STEPS:-40} OUT="$R/compare.jsonl" timeout 420 examples/pytorch/compare.sh 2> "$R/compare.err"
rc=$?
tail -3 "$R/compare.err"
echo "compare rc=$rc"
