#!/usr/bin/env bash
# h200-train.sh — one call on the GPU machine (nvidia-h200-x2; MIG stays off, nothing is changed
# on the GPU) for the training issues:
#   1. the Go example (trainer/example/sgd) under `migctl run --gpus 0 --np 7`, gpu backend,
#      gradients in device memory, against the same run on 1 worker (weights must agree);
#   2. a plain torchrun-style PyTorch DDP script over gloo under `migctl run --gpus 0 --np 7`;
#   3. a gang swap with the real shim: `migctl daemon` (NVML, read-only) swaps a 4-worker job out,
#      holds it 40 s (twice its 20-s collective deadline) and in; final weights vs an unswapped run;
#   4. every collective checked on the GPU through the SDK (scripts/gpu-collectives-check.sh);
#   5. extra steps from scripts/h200-train.d/*.sh (PyTorch backend, topology rows) when present.
# Needs bin/migctl, bin/sgd, bin/libmigswap.so (make build shim) built on the dev machine.
# ONLY="1 3" runs just those numbered steps (default: all).
# Results: $OUT/summary.txt (one line per check), $OUT/logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-./h200-train-out}; mkdir -p "$R"
W=$(mktemp -d /tmp/h200-train.XXXX)
M=bin/migctl
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s)
say() { echo "$*" | tee -a "$R/summary.txt"; }
cmpw() { # cmpw DIR_A N_A DIR_B N_B: ranks of A identical, max relative difference A vs B
  python3 - "$@" <<'PY'
import struct, sys
def load(d, r):
    b = open(f"{d}/weights-{r}.bin", "rb").read(); return struct.unpack(f"{len(b)//8}d", b)
a, na, b, nb = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
A = [load(a, r) for r in range(na)]; B = load(b, 0)
same = all(x == A[0] for x in A)
d = max(abs(p - q) / max(abs(p), abs(q), 1e-12) for p, q in zip(A[0], B))
print(f"ranks identical {same}, max relative difference {d:.2e}")
sys.exit(0 if same and d <= 1e-6 else 1)
PY
}
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
dur() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("duration") or d.get("seconds"), "restarts", d.get("restarts"))' "$1" 2>/dev/null; }
nvidia-smi --query-gpu=index,name,mig.mode.current,memory.used --format=csv,noheader > "$R/gpus.txt" 2>&1
cat "$R/gpus.txt"

if want 1; then
echo "== 1. Go example, 7 workers on GPU 0 vs 1 worker"
$M run --gpus 0 --np 7 -o json -q -- bin/sgd --steps 200 --batch 56 --device-buffers --log-every 50 --out "$W/sgd7" > "$W/sgd7.json" 2> "$W/sgd7.err"; rc7=$?
$M run --gpus 0 --np 1 -o json -q -- bin/sgd --steps 200 --batch 56 --device-buffers --log-every 50 --out "$W/sgd1" > "$W/sgd1.json" 2> "$W/sgd1.err"; rc1=$?
grep -h "sgd: done" "$W/sgd7.err" "$W/sgd7.json" "$W/sgd1.err" "$W/sgd1.json" 2>/dev/null | head -2
if [ $rc7 = 0 ] && [ $rc1 = 0 ] && c=$(cmpw "$W/sgd7" 7 "$W/sgd1" 1); then
  say "PASS go-example-7-on-gpu0: $c; 7 workers $(dur "$W/sgd7.json"), 1 worker $(dur "$W/sgd1.json")"
else
  say "FAIL go-example-7-on-gpu0 (rc $rc7/$rc1): ${c:-}"; tail -5 "$W/sgd7.err"
fi

fi
if want 2; then
echo "== 2. plain PyTorch DDP over gloo, 7 workers on GPU 0"
if $M run --gpus 0 --np 7 -o json -q -- python3 scripts/ddp_plain_gloo.py --steps 50 > "$W/gloo7.json" 2> "$W/gloo7.err"; then
  say "PASS pytorch-gloo-7-on-gpu0: $(grep -h '"script"' "$W/gloo7.err" "$W/gloo7.json" | head -1)"
else
  say "FAIL pytorch-gloo-7-on-gpu0"; tail -8 "$W/gloo7.err"
fi

fi
if want 3; then
echo "== 3. gang swap with the real shim, held 40 s past a 20-s deadline"
$M daemon --socket "$W/c.sock" --swap-socket "$W/s.sock" > "$W/daemon.log" 2>&1 &
dpid=$!
for _ in $(seq 100); do [ -S "$W/c.sock" ] && break; sleep 0.1; done
job() { # job NAME OUTDIR
  $M run --gpus 0 --np 4 --socket "$W/c.sock" --swap --swap-lib "$PWD/bin/libmigswap.so" --swap-socket "$W/s.sock" \
    --job "$1" --timeout 20s -o json -q -- bin/sgd --steps 300 --batch 56 --device-buffers --step-delay 20ms \
    --log-every 100 --out "$2"
}
job ref "$W/ref" > "$W/ref.json" 2> "$W/ref.err"; rcr=$?
job held "$W/held" > "$W/held.json" 2> "$W/held.err" &
jpid=$!
for _ in $(seq 300); do
  n=$($M swap status --socket "$W/c.sock" -o json 2>/dev/null | python3 -c 'import json,sys; print(sum(1 for p in json.load(sys.stdin).get("processes") or [] if p.get("job")=="held"))' 2>/dev/null)
  [ "${n:-0}" -ge 4 ] && break; sleep 0.1
done
sleep 2
ts=$(date +%s.%N)
$M swap out --job held --socket "$W/c.sock" -o json > "$W/swapout.json" 2>&1; rco=$?
$M swap status --socket "$W/c.sock" > "$W/status-out.txt" 2>&1
sleep 40
$M swap in --job held --socket "$W/c.sock" -o json > "$W/swapin.json" 2>&1; rci=$?
wait $jpid; rch=$?
te=$(date +%s.%N)
kill $dpid 2>/dev/null; wait $dpid 2>/dev/null
cat "$W/status-out.txt"
if [ $rcr = 0 ] && [ $rch = 0 ] && [ $rco = 0 ] && [ $rci = 0 ] && c=$(cmpw "$W/held" 4 "$W/ref" 4); then
  say "PASS gang-swap-40s-real-shim: $c; held job $(dur "$W/held.json") (swap-out at +2 s, in after 40 s), ref $(dur "$W/ref.json")"
else
  say "FAIL gang-swap-40s-real-shim (ref $rcr, held $rch, out $rco, in $rci): ${c:-}"; tail -5 "$W/held.err"; tail -3 "$W/swapout.json"
fi

fi
if want 4; then
echo "== 4. every collective on the GPU through the SDK"
OUT="$W/check" timeout 300 scripts/gpu-collectives-check.sh > "$W/gpu-check.txt" 2>&1
say "gpu-collectives-check: $(tail -1 "$W/gpu-check.txt")"
fi

for x in scripts/h200-train.d/*.sh; do
  [ -f "$x" ] || continue
  want "$(basename "$x" .sh)" || continue
  echo "== $x"
  OUT="$W/$(basename "$x" .sh)" timeout 420 bash "$x" > "$W/$(basename "$x" .sh).txt" 2>&1
  say "$(basename "$x"): rc=$? $(tail -1 "$W/$(basename "$x" .sh).txt")"
done
tar czf "$R/logs.tgz" -C "$W" . 2>/dev/null
say "wall $(( $(date +%s) - t0 ))s"
