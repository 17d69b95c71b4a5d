#!/usr/bin/env bash
# DDP over the migctl backend under `migctl run --swap` (issue 11), run by scripts/h200-train.sh with
# ONLY=pytorch-swap (or alone from the repository root). One `migctl daemon` (NVML, read-only;
# --rebalance-every 1s), and three runs of the same deterministic job: DDP ResNet-18 (64x64 images,
# batch 8, 100 classes), 7 ranks on GPU 0 under the shim, fixed seeds, 60 steps of which rank 0
# reports every loss and a parameter checksum:
#   1. ref   unpreempted;
#   2. held  gang swap-out by hand (`migctl swap out --job held`) at step 10, held 25 s (past the
#            20-s collective deadline), swapped in; must end with ref's losses and parameters;
#   3. low   preempted by a higher-priority job: a priority-10 process under the shim
#            (scripts/swap_train.py hog) asks for more device memory than is free at step 10, so the
#            daemon swaps the priority-0 job out as a gang, grants the memory for 20 s, and swaps
#            the job back in when it exits; must end with ref's losses and parameters.
# Needs bin/migctl, bin/libmigctl.so, bin/libmigswap.so (make build shim lib), torch 2.x with CUDA.
# Logs under $OUT/pytorch-swap/; one PASS/FAIL line per check; last line "N passed, N failed".
# About 3 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${OUT:-./h200-out}/pytorch-swap; mkdir -p "$R"
export MIGCTL_LIB=$PWD/bin/libmigctl.so PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
M=bin/migctl
S=$(mktemp -d /tmp/pt-swap.XXXX) # sockets and marks: short paths
pass=0 fail=0
verdict() { # verdict NAME OK DETAIL
  if [ "$2" = 1 ]; then pass=$((pass+1)); echo "PASS $1: $3"; else fail=$((fail+1)); echo "FAIL $1: $3"; fi
}
$M daemon --socket "$S/c.sock" --swap-socket "$S/s.sock" --rebalance-every 1s > "$R/daemon.log" 2>&1 &
dpid=$!
cleanup() { kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; exec 3>&- 2>/dev/null; rm -rf "$S"; }
trap cleanup EXIT
for _ in $(seq 150); do [ -S "$S/c.sock" ] && [ -S "$S/s.sock" ] && break; sleep 0.1; done
[ -S "$S/c.sock" ] || { verdict daemon 0 "migctl daemon did not start: $(tail -3 "$R/daemon.log")"; echo "$pass passed, $fail failed"; exit 1; }

TRAIN=(python3 examples/pytorch/ddp_resnet.py --backend migctl --deterministic --image-size 64 --batch 8
       --classes 100 --pool 4 --warmup 0 --steps 60 --losses 60 --step-delay 0.2)
job() { # job NAME: the training job under the shim at priority 0 (stdout/stderr to $R/NAME.*)
  timeout 150 $M run --gpus 0 --np 7 --socket "$S/c.sock" --swap --swap-lib "$PWD/bin/libmigswap.so" \
    --swap-socket "$S/s.sock" --job "$1" --priority 0 --timeout 20s -q -o json -- \
    "${TRAIN[@]}" --mark-at 10 --mark-file "$S/$1.mark" > "$R/$1.out" 2> "$R/$1.err"
}
same() { # same A B: runs A and B ended with bit-identical losses and parameters (rank 0's report)
  python3 - "$R/$1" "$R/$2" <<'PY'
import json, sys
def report(base):
    for f in (base + ".out", base + ".err"):
        for line in open(f, errors="replace"):
            if line.startswith("[0]: {"):
                return json.loads(line[5:])
    return None
a, b = report(sys.argv[1]), report(sys.argv[2])
if a is None or b is None:
    print("no report from rank 0"); sys.exit(1)
la, lb = a["losses"], b["losses"]
d = max((abs(x - y) for x, y in zip(la, lb)), default=float("nan"))
ok = la == lb and len(la) == 60 and a["param_checksum"] == b["param_checksum"] and a["ranks_identical"] and b["ranks_identical"]
print(f"{len(la)} losses identical {la == lb} (max diff {d:.3g}), parameters identical "
      f"{a['param_checksum'] == b['param_checksum']}, ranks identical {a['ranks_identical']}, last loss {la[-1]:.6f}")
sys.exit(0 if ok else 1)
PY
}
waitmark() { for _ in $(seq 900); do [ -e "$S/$1.mark" ] && return 0; sleep 0.1; done; return 1; }
jobstate() { # jobstate JOB: "<processes> <bytes> <states>" from the daemon
  $M swap status --socket "$S/c.sock" -o json 2>/dev/null | python3 -c '
import json, sys
ps = [p for p in json.load(sys.stdin).get("processes") or [] if p.get("job") == sys.argv[1]]
print(len(ps), sum(int(p.get("bytes") or 0) for p in ps), ",".join(sorted({p.get("state") or "?" for p in ps})) or "-")' "$1" 2>/dev/null || echo "0 0 -"
}
dur() { # the run's seconds from migctl run's JSON summary (after the workers' "[r]: " lines)
  python3 -c '
import json, sys
t = open(sys.argv[1]).read(); i = t.find("\n{") + 1 if not t.startswith("{") else 0
print(json.loads(t[i:]).get("seconds"))' "$1" 2>/dev/null
}
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' | tee "$R/torch.txt"

echo "== 1. ref: unpreempted"
job ref; rcr=$?
[ $rcr = 0 ] || tail -5 "$R/ref.err"

echo "== 2. held: gang swap-out by hand at step 10, held 25 s, swap-in"
job held & jp=$!
if waitmark held; then
  $M swap out --job held --socket "$S/c.sock" -o json > "$R/held-swapout.json" 2>&1; rco=$?
  st_out=$(jobstate held)
  sleep 25
  st_held=$(jobstate held)
  $M swap in --job held --socket "$S/c.sock" -o json > "$R/held-swapin.json" 2>&1; rci=$?
else
  rco=9 rci=9 st_out="never reached step 10" st_held=""
fi
wait $jp; rch=$?
c=$(same ref held); rcs=$?
ok=0; [ $rcr = 0 ] && [ $rch = 0 ] && [ $rco = 0 ] && [ $rci = 0 ] && [ $rcs = 0 ] && [[ "$st_held" == *" out" ]] && ok=1
verdict ddp-gang-swap-by-hand $ok "$c; job state after swap-out [$st_out], 25 s later [$st_held]; ref $(dur "$R/ref.out") s, held $(dur "$R/held.out") s (rc ref $rcr, held $rch, out $rco, in $rci)"
[ $ok = 1 ] || { tail -5 "$R/held.err"; tail -3 "$R/held-swapout.json" "$R/held-swapin.json"; }

echo "== 3. low: preempted by a priority-10 job that needs the GPU's memory for 20 s"
mkfifo "$S/hog.in"
LD_PRELOAD=$PWD/bin/libmigswap.so MIGSWAP_SOCKET=$S/s.sock MIGSWAP_JOB=hog MIGSWAP_PRIORITY=10 \
  timeout 150 python3 scripts/swap_train.py hog --wait --hold 20 < "$S/hog.in" > "$R/hog.out" 2>&1 & hp=$!
exec 3> "$S/hog.in"
job low & jp=$!
seen=""
if waitmark low; then
  read -r n bytes st <<< "$(jobstate low)"
  # more than is free, less than free + the job's bytes - the daemon's headroom (as swap_train.py's check)
  extra=$(( (bytes - (320 << 20)) / 2 )); [ $extra -lt $((64 << 20)) ] && extra=$((64 << 20))
  echo "low job: $n processes, $bytes bytes, state $st; hog asks free + $((extra >> 20)) MiB"
  echo "go $extra" >&3
  for _ in $(seq 900); do
    s=$(jobstate low); s=${s##* }
    [[ ",$seen," == *",$s,"* ]] || seen="$seen${seen:+,}$s"
    kill -0 $hp 2>/dev/null || break
    sleep 0.2
  done
else
  echo "stop" >&3
fi
exec 3>&-
wait $hp; rchog=$?
for _ in $(seq 50); do s=$(jobstate low); s=${s##* }; [[ ",$seen," == *",$s,"* ]] || seen="$seen${seen:+,}$s"; sleep 0.2; kill -0 $jp 2>/dev/null || break; done
wait $jp; rcl=$?
c=$(same ref low); rcs=$?
hog=$(grep -h '^RESULT' "$R/hog.out" | tail -1)
ok=0; [ $rcr = 0 ] && [ $rcl = 0 ] && [ $rcs = 0 ] && [[ "$hog" == *"ok=1"* ]] && [[ ",$seen," == *",out,"* ]] && ok=1
verdict ddp-preempted-by-priority-job $ok "$c; low job's states seen [$seen]; high job: ${hog:-no result} (rc $rchog); low $(dur "$R/low.out") s (rc $rcl)"
[ $ok = 1 ] || { tail -5 "$R/low.err"; tail -3 "$R/hog.out"; grep -h -i "need\|swapping" "$R/daemon.log" | tail -5; }
echo "$pass passed, $fail failed"
