#!/usr/bin/env bash
# gpu-collectives-check.sh — correctness of every collective on real GPUs (issue 3, item 7):
# all-reduce, reduce-scatter, all-gather, broadcast and barrier through migctl bench with -c 1
# (every element of every rank's result checked), N processes sharing GPU 0 through shared host
# memory (--transport shm, the MIG path), over several dtypes and ops, in and out of place, and
# the IPC ring across two GPUs where there are two. Needs bin/migctl (built here). Prints one
# line per case and a closing "N passed, N failed"; logs under $OUT (one tarball).
set -uo pipefail
cd "$(dirname "$0")/.."
M=${MIGCTL:-bin/migctl}
BACKEND=${BACKEND:-gpu}   # BACKEND=host runs the same matrix without a GPU
R=${OUT:-./gpu-check-out}; mkdir -p "$R"
W=$(mktemp -d /tmp/gpu-check.XXXX)
pass=0 fail=0 i=0
run() { # run NAME ARGS...
  local name=$1; shift; i=$((i+1))
  if timeout 120 "$M" bench "$@" --backend "$BACKEND" -c 1 -n 2 -w 1 -q > "$W/$i-$name.txt" 2>&1; then
    pass=$((pass+1)); echo "ok    $name: $*"
  else
    fail=$((fail+1)); echo "FAIL  $name: $*"; tail -3 "$W/$i-$name.txt"
  fi
}
for coll in allreduce reducescatter allgather broadcast barrier; do
  for np in 2 7; do
    # -b: its default (8 bytes, one element per rank for reduce-scatter and all-gather);
    # odd: np+1 floats, not a multiple of np
    run "$coll-np$np" "$coll" --np "$np" --transport shm -e 8MiB -f 32
    odd=$((4 * (np + 1)))
    run "$coll-np$np-odd-inplace" "$coll" --np "$np" --transport shm -b "$odd" -e "$odd" --inplace
  done
done
for dt in float16 bfloat16 float64 int32 int64 uint8; do
  for op in sum avg min max; do
    run "allreduce-$dt-$op" allreduce --np 3 --transport shm --dtype "$dt" --op "$op" -b 1000 -e 3MiB -f 50
  done
done
run "reducescatter-bf16-max" reducescatter --np 5 --transport shm --dtype bf16 --op max -b 960 -e 960KiB -f 1000
run "broadcast-root3" broadcast --np 5 --transport shm --root 3 -b 8 -e 4MiB -f 64
run "allreduce-ring" allreduce --np 4 --transport shm --algo ring -b 8 -e 8MiB -f 32
# The small all-reduce on the devices (streams wait for the flags; up to --small-bytes, then the
# host-staged schedule, so calls of both kinds follow each other)
for np in 2 7; do
  run "allreduce-smallondevice-np$np" allreduce --np "$np" --transport shm --small-on device -b 4 -e 1MiB -f 4
done
for dt in float16 bfloat16 int32 uint8; do
  run "allreduce-smallondevice-$dt-avg" allreduce --np 5 --transport shm --small-on device --dtype "$dt" --op avg -b 1000 -e 64KiB -f 4 --inplace
done
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${ngpu:-0}" -ge 2 ] && [ "$BACKEND" = gpu ]; then
  run "allreduce-ipc-2gpu" allreduce --np 2 --transport ipc --gpu 0,1 -b 8 -e 64MiB -f 16
  run "allreduce-ipc-2gpu-bf16-avg" allreduce --np 2 --transport ipc --gpu 0,1 --dtype bf16 --op avg -b 1000 -e 1MiB -f 1000
fi
tar czf "$R/gpu-check-logs.tgz" -C "$W" . 2>/dev/null
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
