#!/usr/bin/env bash
# The main job, end to end on this machine: partition a node into MIG instances, run checked
# collectives between processes through shared host memory, and preempt a job's GPU memory
# through the swap shim and the node daemon. Without a GPU it uses the simulated H200 node, the
# host-memory backend and the fake libcuda.so that the shim's tests use.
set -euo pipefail
cd "$(dirname "$0")/.."
M=bin/migctl
work=$(mktemp -d)
daemon=
cleanup() { [ -n "$daemon" ] && kill "$daemon" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

echo "== 1. migctl partition: apply a layout to a simulated 8x H200 node, show it, assert it"
state=$work/node.json
$M partition apply --sim h200x8 --sim-state "$state" --gpus all --layout '3g.71gb=1,2g.35gb=1,1g.18gb=1'
$M partition show --sim h200x8 --sim-state "$state" | sed -n 1,9p
$M partition assert --sim h200x8 --sim-state "$state" --gpus all --layout '3g.71gb=1,2g.35gb=1,1g.18gb=1'

echo "== 2. migctl bench allreduce: 4 ranks as separate processes, host backend, every element checked"
$M bench allreduce --np 4 --backend host -b 8KiB -e 64MiB -f 8 -c 1

echo "== 3. migctl run: data-parallel SGD (trainer/example/sgd) on 7 MIG instances leased from a"
echo "      simulated node (the daemon starts inside migctl run and creates the instances), then on 1"
$M run --sim h200x8 --sim-state "$work/run-node.json" --np 7 --profile 1g.18gb -- bin/sgd --steps 100 --batch 56 --out "$work/sgd7"
$M run --sim h200x8 --sim-state "$work/run-node.json" --np 1 --profile 1g.18gb -q -- bin/sgd --steps 100 --batch 56 --out "$work/sgd1" --log-every 0
if cmp -s "$work/sgd7/weights-0.bin" "$work/sgd7/weights-6.bin"; then echo "ranks 0 and 6 hold identical weights"; else echo "ranks differ"; exit 1; fi
python3 - "$work" <<'PY' 2>/dev/null || echo "(python3 not found: skipped the 7-vs-1 comparison)"
import struct, sys
a = open(sys.argv[1] + "/sgd7/weights-0.bin", "rb").read(); b = open(sys.argv[1] + "/sgd1/weights-0.bin", "rb").read()
x = struct.unpack("%dd" % (len(a) // 8), a); y = struct.unpack("%dd" % (len(b) // 8), b)
d = max(abs(p - q) / max(abs(p), abs(q), 1e-12) for p, q in zip(x, y))
print("7 ranks x batch 8 vs 1 rank x batch 56: largest relative difference of the weights %.1e" % d)
sys.exit(0 if d < 1e-6 else 1)
PY

echo "== 4. migctl daemon + libmigswap.so: swap a running job's device memory out and back in"
if [ -x "$M" ] && [ -f bin/libmigswap.so ] && [ -x bin/migswap_testprog ]; then
  $M daemon --gpu-memory 64MiB --swap-socket "$work/swap.sock" --socket "$work/ctl.sock" >"$work/daemon.log" 2>&1 &
  daemon=$!
  for _ in $(seq 50); do [ -S "$work/ctl.sock" ] && break; sleep 0.1; done
  mkfifo "$work/stdin"
  # A program using the CUDA driver API (on the fake libcuda.so, host-memory backed): 4 buffers of
  # 8 MiB, kernels and a CUDA graph launched in a loop; at the end it checks every float.
  LD_PRELOAD=$PWD/bin/libmigswap.so LD_LIBRARY_PATH=$PWD/bin/fakecuda MIGSWAP_SOCKET=$work/swap.sock \
    MIGSWAP_JOB=demo-train MIGSWAP_PRIORITY=0 MIGSWAP_CHECKSUM=1 FAKECUDA_MEM_BYTES=$((64 << 20)) \
    FAKECUDA_STATS=$work/fakecuda.stats bin/migswap_testprog dlsym loop 4 $((8 << 20)) <"$work/stdin" >"$work/prog.out" &
  prog=$!
  exec 3>"$work/stdin"
  for _ in $(seq 50); do grep -q READY "$work/prog.out" 2>/dev/null && break; sleep 0.1; done
  sleep 0.5
  $M swap status --socket "$work/ctl.sock"
  $M swap out --job demo-train --socket "$work/ctl.sock" -q
  $M swap status --socket "$work/ctl.sock"
  $M swap in --job demo-train --socket "$work/ctl.sock" -q
  sleep 0.5
  echo stop >&3
  exec 3>&-
  wait "$prog"
  grep RESULT "$work/prog.out"
else
  echo "(skipped: run 'make shim' first)"
fi
