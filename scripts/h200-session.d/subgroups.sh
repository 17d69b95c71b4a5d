#!/usr/bin/env bash
# Groups of some of the ranks (dist.new_group(ranks=[...]), C ABI 9) on a real H200 (2026-12-02, sixth
# part, call 1): subgroup_check.py and FSDP HYBRID_SHARD on CUDA tensors, the regression checks, and the
# per-call probe and DDP rows beside the session's starting build (dc77d5a: bin/old/libmigctl.so with its
# own python/ and examples/ under bin/old), interleaved.
# Build: make build lib; bin/old as in the session's notes; carry ["bin"]. Output: $OUT/subgroups/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init subgroups
OLD=$PWD/bin/old/libmigctl.so
clean() { echo "clean: $(grep -c '"failures": \[\]' "$1") of $2"; }
for np in 4 7; do
  timeout 120 $M run --gpus 0 --np $np -q --timeout 60s -- python3 python/tests/subgroup_check.py --device cuda \
    >"$W/subgroup-$np.out" 2>&1
  say "subgroup_check cuda np=$np rc=$? $(clean "$W/subgroup-$np.out" $np)"
done
for s in hybrid full; do
  timeout 150 $M run --gpus 0 --np 4 -q --timeout 120s -- python3 python/tests/fsdp_check.py --strategy $s \
    >"$W/fsdp-$s.out" 2>&1
  say "fsdp_check $s np=4 rc=$? $(clean "$W/fsdp-$s.out" 4) $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/fsdp-$s.out" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("rel_loss_diff=%.3g param_diff=%.3g loss_last ddp=%.5f fsdp=%.5f" % (r["max_rel_loss_diff"], r["max_param_diff"], r["loss_last_ddp"], r["loss_last_fsdp"]))' 2>/dev/null)"
done
timeout 150 $M run --gpus 0 --np 7 -q --timeout 60s -- python3 python/tests/ops_check.py --device cuda >"$W/ops.out" 2>&1
say "ops_check cuda np=7 rc=$? $(clean "$W/ops.out" 7) checks(rank 0): $(sed -n 's/^\[0\]: .*"checks": \([0-9]*\).*/\1/p' "$W/ops.out")"
timeout 120 $M run --gpus 0 --np 7 -q --timeout 60s -- python3 python/tests/gpu_checks.py >"$W/gpu.out" 2>&1
say "gpu_checks np=7 rc=$? $(clean "$W/gpu.out" 7)"
for i in 1 2; do
  MIGCTL_LIB=$OLD TREE=bin/old ovh "old$i"
  ovh "new$i"
done
DDP_DEADLINE=560
for i in 1 2; do
  MIGCTL_LIB=$OLD TREE=bin/old ddp resnet8-old$i resnet 8 migctl
  ddp resnet8-new$i resnet 8 migctl
  MIGCTL_LIB=$OLD TREE=bin/old ddp gpt4-old$i gpt 4 migctl
  ddp gpt4-new$i gpt 4 migctl
done
ddp resnet8-gloo resnet 8 gloo
