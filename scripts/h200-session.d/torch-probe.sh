#!/usr/bin/env bash
# Issue 11 probes on one H200, 7 ranks on GPU 0 (lead's GPU call):
#  1. DDP ResNet-18 batch 32 with its gradients left unreduced (--probe-hook noop: no communication;
#     sync: one 1-element all-reduce per bucket) beside the real migctl run and the bound: how much
#     of the exposed time is synchronisation, how much data movement;
#  2. deterministic ResNet-18 batch 8, migctl vs gloo: the first 50 losses must agree to round-off;
#  3. the op suite on CUDA tensors, 7 ranks, sizes 0, 7, 65539 (OMP_NUM_THREADS=1 from migctl run now).
# Logs under $OUT/torch-probe/; PASS/FAIL lines and a table at the end.
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp}/torch-probe; mkdir -p "$O"
export MIGCTL_LIB=$PWD/bin/libmigctl.so
J=$O/runs.jsonl; : >"$J"
run() { # tag model batch backend [args]
  local tag=$1 m=$2 b=$3 be=$4; shift 4
  timeout 120 bin/migctl run --gpus 0 --np 7 -q -- python3 examples/pytorch/ddp_$m.py --backend $be --batch $b "$@" \
    2>"$O/$tag.err" | sed -n 's/^\[0\]: \({.*}\)$/\1/p' | TAG=$tag python3 -c "import json,os,sys
for l in sys.stdin:
  r=json.loads(l); r['tag']=os.environ['TAG']; print(json.dumps(r))" >>"$J"
}
run bound-32 resnet 32 none --steps 30
run migctl-32 resnet 32 migctl --steps 30
run noop-32 resnet 32 migctl --steps 30 --probe-hook noop
run sync-32 resnet 32 migctl --steps 30 --probe-hook sync
run gloo-sync-32 resnet 32 gloo --steps 30 --probe-hook sync
run det-migctl-8 resnet 8 migctl --steps 40 --deterministic
run det-gloo-8 resnet 8 gloo --steps 40 --deterministic
python3 - "$J" <<'PY'
import json, sys
rows = {r["tag"]: r for r in map(json.loads, filter(str.strip, open(sys.argv[1])))}
b = rows.get("bound-32", {}).get("step_ms_median_slowest_rank")
for t, r in rows.items():
    ms = r["step_ms_median_slowest_rank"]
    print(f"{t:14} {ms:8.1f} ms/step  {100*b/ms if b else 0:5.0f}% of bound  ranks identical {r['ranks_identical']}")
a, g = rows.get("det-migctl-8"), rows.get("det-gloo-8")
if a and g:
    d = max(abs(x - y) for x, y in zip(a["losses"], g["losses"]))
    rel = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a["losses"], g["losses"]))
    print(f"{'PASS' if rel <= 1e-5 else 'FAIL'} deterministic ResNet-18 b8: max |loss migctl - loss gloo| over {len(a['losses'])} steps = {d:.3g} (relative {rel:.3g})")
else:
    print("FAIL deterministic runs missing")
PY
echo "== op suite, CUDA, 7 ranks"
OPS_DUMP_AFTER=150 timeout 170 bin/migctl run --gpus 0 --np 7 --timeout 30s -- \
  python3 python/tests/ops_check.py --device cuda --sizes 0,7,65539 >"$O/ops7.out" 2>&1
rc=$?
grep -h '"checks"' "$O/ops7.out" | head -2
echo "$([ $rc = 0 ] && echo PASS || echo FAIL) op suite on CUDA tensors, 7 ranks, sizes 0,7,65539 (rc $rc)"
