#!/usr/bin/env bash
# The last PyTorch-side changes of 2026-12-02, sixth part, on CUDA tensors under torch 2.11: all-to-all of
# uneven blocks (ops_check), and destroy_process_group of a group of some ranks freeing it (subgroup_check's
# teardown: torch 2.9+ calls the group's shutdown).
# Build: make build lib; carry ["bin"]. Output: $OUT/lasttorch/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init lasttorch
timeout 150 $M run --gpus 0 --np 3 -q --timeout 60s -- python3 python/tests/ops_check.py --device cuda >"$W/ops.out" 2>&1
say "ops_check cuda np=3 rc=$? clean: $(grep -c '"failures": \[\]' "$W/ops.out") of 3; $(grep -o '"failures": \[[^]]*\]' "$W/ops.out" | sort | uniq -c | head -3)"
timeout 120 $M run --gpus 0 --np 4 -q --timeout 60s -- python3 python/tests/subgroup_check.py --device cuda \
  >"$W/subgroup-4.out" 2>&1
say "subgroup_check cuda np=4 rc=$? clean: $(grep -c '"failures": \[\]' "$W/subgroup-4.out") of 4; $(grep -o '"failures": \[[^]]*\]' "$W/subgroup-4.out" | sort | uniq -c | head -3 | cut -c1-300)"
