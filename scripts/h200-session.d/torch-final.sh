#!/usr/bin/env bash
# Issue 11 on one H200, 7 ranks on GPU 0 (lead's last GPU call of the session):
#  1. FSDP vs DDP over migctl on the GPT of examples/pytorch/ddp_gpt.py (27M: 6 layers, d 512, seq 256);
#  2. deterministic ResNet-18 batch 8, migctl vs gloo: loss differences step by step (where they start);
#  3. ResNet-18 b32 and GPT b4: bound, migctl, gloo, DDP without communication (noop hook), bound again
#     (the bound moved from 26.6 to 58.2 ms between two calls: measured twice around the others).
# Logs under $OUT/torch-final/.
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp}/torch-final; mkdir -p "$O"
export MIGCTL_LIB=$PWD/bin/libmigctl.so PYTHONUNBUFFERED=1
J=$O/runs.jsonl; : >"$J"
timeout 90 bin/migctl run --gpus 0 --np 7 -q --timeout 60s -- python3 python/tests/fsdp_check.py \
  --layers 6 --d-model 512 --heads 8 --seq 256 --vocab 16384 >"$O/fsdp27m.out" 2>"$O/fsdp27m.err"
rc=$?; l=$(grep -h '^\[0\]: {' "$O/fsdp27m.out" | head -1 | cut -c 1-400)
echo "$([ $rc = 0 ] && [ -n "$l" ] && echo PASS || echo FAIL) fsdp-vs-ddp GPT 27M 7 ranks (rc $rc): $l"
run() { # tag model batch backend [args]
  local tag=$1 m=$2 b=$3 be=$4; shift 4
  timeout 100 bin/migctl run --gpus 0 --np 7 -q -- python3 examples/pytorch/ddp_$m.py --backend $be --batch $b "$@" \
    2>"$O/$tag.err" | sed -n 's/^\[0\]: \({.*}\)$/\1/p' | TAG=$tag python3 -c "import json,os,sys
for l in sys.stdin:
  r=json.loads(l); r['tag']=os.environ['TAG']; print(json.dumps(r))" >>"$J"
}
run det-migctl-8 resnet 8 migctl --steps 40 --deterministic
run det-gloo-8 resnet 8 gloo --steps 40 --deterministic
for m in "resnet 32" "gpt 4"; do
  set -- $m
  run "$1-$2-bound-a" $1 $2 none --steps 25
  run "$1-$2-migctl" $1 $2 migctl --steps 25
  run "$1-$2-gloo" $1 $2 gloo --steps 25
  run "$1-$2-noop" $1 $2 migctl --steps 25 --probe-hook noop
  run "$1-$2-bound-b" $1 $2 none --steps 25
done
python3 - "$J" <<'PY'
import json, sys
rows = {r["tag"]: r for r in map(json.loads, filter(str.strip, open(sys.argv[1])))}
for t, r in rows.items():
    print(f"{t:18} {r['step_ms_median_slowest_rank']:8.1f} ms/step (mean {r['step_ms_slowest_rank']:.1f})  ranks identical {r['ranks_identical']}")
a, g = rows.get("det-migctl-8"), rows.get("det-gloo-8")
if a and g:
    d = [abs(x - y) for x, y in zip(a["losses"], g["losses"])]
    print("loss |migctl-gloo| by step:", " ".join(f"{i}:{d[i]:.2e}" for i in (0, 1, 2, 3, 5, 8, 12, 20, 30, 40, len(d) - 1) if i < len(d)))
    print("losses migctl:", " ".join(f"{x:.7f}" for x in a["losses"][:6]))
    print("losses gloo:  ", " ".join(f"{x:.7f}" for x in g["losses"][:6]))
PY
