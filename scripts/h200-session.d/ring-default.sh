#!/usr/bin/env bash
# The staged ring as the default for 2 ranks on one GPU (auto, on the figures `migctl bench
# limits` measured, which bench now hands its ranks): 256 MiB default vs --algo hoststaged,
# interleaved; a 64 KiB..64 MiB sweep of both (the choice holds for every size above the small
# path); 3 and 7 ranks and 8 KiB unchanged; gloo in the same call; correctness of the default
# 2-rank all-reduce over dtypes, ops, odd sizes, in place; the GPU unit test of staged reductions;
# then scripts/gpu-collectives-check.sh while time is left.
# Build: make build; go test -c -o bin/comm.test ./comm; cp ../shared/bench/gloo_allreduce.py bin/;
# carry ["bin"]. Output: $OUT/ringdef/{summary.txt,logs.tgz}. ~6 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init ringdef
$M bench limits >>"$S" 2>&1
for i in 1 2 3; do
  row "r2-default-$i" 2 256MiB 10 3
  row "r2-hoststaged-$i" 2 256MiB 10 3 --algo hoststaged
done
for a in default hoststaged; do
  extra=(); [ "$a" = default ] || extra=(--algo "$a")
  timeout 150 $M bench allreduce --backend gpu --transport shm --gpu 0 --np 2 -b 64KiB -e 64MiB -f 4 -n 20 -w 5 -c 1 \
    "${extra[@]}" >"$W/sweep2-$a.txt" 2>&1
  say "sweep 2 ranks $a rc=$?"; grep -E '^(SIZE|[0-9])' "$W/sweep2-$a.txt" | awk '{print "  " $1, $6, $8, $9, $10, $11}' >>"$S"
done
row r3-default 3 256MiB 10 3
row r7-default 7 256MiB 10 3
row r7-8K 7 8KiB 3000 300
row r2-8K 2 8KiB 3000 300
timeout 200 python3 bin/gloo_allreduce.py --np 2,7 --sizes 8K,256M --iters 5 >"$W/gloo.txt" 2>&1
say "gloo rc=$?"; grep -E "^gloo" "$W/gloo.txt" >>"$S"
n=0
for c in "float sum" "bf16 avg" "half sum" "double min" "int64 max" "uint8 min" "int32 sum"; do
  set -- $c; n=$((n+1)); ip=(); [ $((n % 2)) = 0 ] && ip=(--inplace)
  timeout 120 $M bench allreduce --backend gpu --transport shm --gpu 0 --np 2 -b 8 -e 40MiB -f 9 -n 2 -w 1 -c 1 \
    --dtype "$1" --op "$2" "${ip[@]}" -o json >"$W/c2-$1-$2.json" 2>"$W/c2-$1-$2.err"
  say "check 2 ranks $1 $2 ${ip[*]} rc=$? $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("algo=%s sizes=%d wrong=%d" % (d["algorithm"], len(d["rows"]), sum(r["wrong"] for r in d["rows"])))' "$W/c2-$1-$2.json" 2>/dev/null)"
done
timeout 120 bin/comm.test -test.run 'TestCUDADeviceGPUStagedReduce|TestCUDADeviceGPUReduce$' -test.count=1 >"$W/comm.txt" 2>&1
say "comm GPU staged/plain reduce tests rc=$? $(tail -1 "$W/comm.txt")"
if [ "$SECONDS" -lt 330 ]; then
  OUT=$W/gc timeout $((560 - SECONDS)) bash scripts/gpu-collectives-check.sh >"$W/gc.txt" 2>&1
  say "gpu-collectives-check rc=$? $(tail -1 "$W/gc.txt")"; grep FAIL "$W/gc.txt" >>"$S"
else
  say "gpu-collectives-check skipped (time)"
fi
