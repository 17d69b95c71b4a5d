#!/usr/bin/env bash
# FSDP2 (fully_shard on a device mesh) over the migctl backend on a real H200 (2026-12-02, sixth part,
# call 2): a 1-D mesh of 4 ranks, and a 2-D one (replicate x shard pairs: groups of some of the ranks),
# each against DDP's losses; FSDP1 HYBRID_SHARD again with its group sizes checked; ops_check (the extended
# creator API, call 3). Call 2 found torch 2.11's DeviceMesh reading group_name, which the group had not set.
# Build: make build lib; carry ["bin"]. Output: $OUT/fsdp2/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init fsdp2
for s in fsdp2 fsdp2-hybrid hybrid; do
  timeout 170 $M run --gpus 0 --np 4 -q --timeout 120s -- python3 python/tests/fsdp_check.py --strategy $s \
    >"$W/fsdp-$s.out" 2>&1
  say "fsdp_check $s np=4 rc=$? clean: $(grep -c '"failures": \[\]' "$W/fsdp-$s.out") of 4 $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/fsdp-$s.out" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("sizes=%s rel_loss_diff=%.3g param_diff=%.3g loss_last ddp=%.5f fsdp=%.5f s=%.1f" % (r.get("group_sizes"), r["max_rel_loss_diff"], r["max_param_diff"], r["loss_last_ddp"], r["loss_last_fsdp"], r["seconds_total"]))' 2>/dev/null)"
  grep -m3 -E "Error|error:|NotImplemented" "$W/fsdp-$s.out" | cut -c1-400 | tee -a "$S"
done
timeout 150 $M run --gpus 0 --np 3 -q --timeout 60s -- python3 python/tests/ops_check.py --device cuda >"$W/ops.out" 2>&1
say "ops_check cuda np=3 rc=$? clean: $(grep -c '"failures": \[\]' "$W/ops.out") of 3"
