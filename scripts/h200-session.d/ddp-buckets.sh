#!/usr/bin/env bash
# DDP step time vs bucket size, migctl vs gloo vs no communication (7 ranks on GPU 0), issue 11.
# One JSON line per run in $OUT/ddp-buckets/runs.jsonl, a table at the end.
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp}/ddp-buckets; mkdir -p "$O"
export MIGCTL_LIB=$PWD/bin/libmigctl.so
J=$O/runs.jsonl; : >"$J"
run() { # model batch backend bucket [args]
  local m=$1 b=$2 be=$3 bk=$4; shift 4
  timeout 120 bin/migctl run --gpus 0 --np 7 -q -- python3 examples/pytorch/ddp_$m.py --backend $be --batch $b \
    --steps ${STEPS:-30} --bucket-mb $bk "$@" 2>"$O/$m-$b-$be-$bk.err" \
    | sed -n 's/^\[0\]: \({.*}\)$/\1/p' | python3 -c "import json,sys
for l in sys.stdin:
  r=json.loads(l); r['bucket']=$bk; r['extra']='$*'; print(json.dumps(r))" >>"$J"
}
for cfg in ${CFGS:-"resnet 8 none 25" "resnet 8 migctl 25" "resnet 8 migctl 4" "resnet 8 migctl 1" "resnet 8 gloo 25" "resnet 8 gloo 4" \
  "resnet 32 none 25" "resnet 32 migctl 4" "resnet 32 gloo 25" "gpt 4 none 25" "gpt 4 migctl 4" "gpt 4 gloo 25"}; do
  run $cfg
done
python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
bound = {(r["model"], r["batch_per_rank"]): r["step_ms_median_slowest_rank"] for r in rows if r["backend"] == "none"}
print(f"{'model':9} {'batch':>5} {'backend':7} {'bucket':>6} {'ms/step':>8} {'%bound':>7} {'ranks eq'}")
for r in rows:
    b = bound.get((r["model"], r["batch_per_rank"]))
    ms = r["step_ms_median_slowest_rank"]
    print(f"{r['model']:9} {r['batch_per_rank']:>5} {r['backend']:7} {r['bucket']:>6} {ms:8.1f} {100*b/ms if b else 0:6.0f}% {r['ranks_identical']} {r['extra']}")
PY
