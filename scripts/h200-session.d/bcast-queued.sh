#!/usr/bin/env bash
# Broadcasts queued whole on the device (ABI 12: migctl_run of a one-chunk broadcast on CUDA memory returns
# in stream order; migctl_torch sends DDP's asynchronous buffer broadcasts that way), one GPU, 7 ranks on
# GPU 0 under MPS: gpu_checks.py (stream order of broadcasts from slow producers, sync/async/pair/three,
# and how long the root's call takes while its GPU sleeps), ops_check.py on CUDA tensors, then DDP
# ResNet-18 b32 and b8 with it (default) and without (MIGCTL_TUNING=bcast=cpu), interleaved, beside
# --no-broadcast-buffers, none --lockstep and gloo. Build: make build lib; carry ["bin/migctl",
# "bin/libmigctl.so"]. Output: $OUT/queued/. ~6 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init queued
timeout 150 $M run --gpus 0 --np 7 -q --timeout 60s -- python3 python/tests/gpu_checks.py >"$W/gpu_checks.out" 2>&1
say "gpu_checks rc=$? $(sed -n 's/^\[\([0-9]*\)\]: \({.*}\)$/\2/p' "$W/gpu_checks.out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print("ranks=%d failures=%s root_call_ms=%s" % (len(rows), sum(len(r["failures"]) for r in rows),
      [r.get("broadcast_root_call_ms") for r in rows if r["rank"] == 0]))
for r in rows:
    for f in r["failures"]:
        print("  rank", r["rank"], f)' 2>/dev/null || tail -c 400 "$W/gpu_checks.out")"
timeout 150 $M run --gpus 0 --np 7 -q --timeout 60s -- python3 python/tests/ops_check.py --device cuda >"$W/ops.out" 2>&1
say "ops_check cuda 7 ranks rc=$? $(sed -n 's/^\[[0-9]*\]: \({.*}\)$/\1/p' "$W/ops.out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print("ranks=%d checks=%d failed=%d %s" % (len(rows), sum(r["checks"] for r in rows), sum(r["failed"] for r in rows),
      [f for r in rows for f in r["failures"]][:3]))' 2>/dev/null || tail -c 400 "$W/ops.out")"
DDP_DEADLINE=${DDP_DEADLINE:-330}
for i in ${ROUNDS:-1 2}; do
  ddp "resnet32-queued-$i" resnet 32 migctl
  MIGCTL_TUNING=bcast=cpu ddp "resnet32-cpu-$i" resnet 32 migctl
  ddp "resnet8-queued-$i" resnet 8 migctl
  MIGCTL_TUNING=bcast=cpu ddp "resnet8-cpu-$i" resnet 8 migctl
done
[ -n "${SHORT:-}" ] && exit 0
ddp resnet32-lockstep resnet 32 none --lockstep
ddp resnet32-nobcast resnet 32 migctl --no-broadcast-buffers
ddp resnet8-gloo resnet 8 gloo
