#!/usr/bin/env bash
# Groups of some of the ranks with the session's final build (2026-12-02, sixth part, last call): across two
# "nodes" of 2 ranks on GPU 0 (scripts/h200-train.d/pytorch-fsdp.sh, SUBGROUPS_ONLY=1: subgroup_check, FSDP1
# HYBRID_SHARD and FSDP2 on a 2-D mesh, sharded within a node over migctl, replicated across over gloo), then
# on one node: subgroup_check at 7 ranks and fsdp2.sh (FSDP2 1-D and 2-D, FSDP1 hybrid, ops_check).
# Build: make build lib; carry ["bin"]. Output: $OUT/pytorch-fsdp/, $OUT/finalgroups/, $OUT/fsdp2/.
set -uo pipefail
cd "$(dirname "$0")/../.."
SUBGROUPS_ONLY=1 timeout 200 bash scripts/h200-train.d/pytorch-fsdp.sh
. scripts/h200-session.d/lib.sh
session_init finalgroups
timeout 120 $M run --gpus 0 --np 7 -q --timeout 60s -- python3 python/tests/subgroup_check.py --device cuda \
  >"$W/subgroup-7.out" 2>&1
say "subgroup_check cuda np=7 rc=$? clean: $(grep -c '"failures": \[\]' "$W/subgroup-7.out") of 7"
timeout 250 bash scripts/h200-session.d/fsdp2.sh
