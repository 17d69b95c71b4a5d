# Sourced by the session scripts of scripts/h200-session.d (bash, repository root): a summary in
# $O/summary.txt, every other file under $W tarred into $O/logs.tgz at exit (what comes back from
# the device is few files), and `row`, one `migctl bench allreduce` row on GPU 0 with its figures.
# session_init NAME sets O (under $OUT), W (a temp dir), M, S and the trap.
session_init() {
  O=${OUT:-/tmp}/$1; mkdir -p "$O"
  W=$(mktemp -d "/tmp/$1.XXXXXX")
  M=bin/migctl
  export MIGCTL_LIB=$PWD/bin/libmigctl.so PYTHONUNBUFFERED=1
  S=$O/summary.txt; : >"$S"
  trap session_finish EXIT
  nvidia-smi --query-gpu=name,driver_version,mig.mode.current --format=csv,noheader >>"$S" 2>&1
}
say() { echo "$*" | tee -a "$S"; }
session_finish() { tar -C "$W" -czf "$O/logs.tgz" . 2>/dev/null; say "done in ${SECONDS}s"; }
row() { # tag np size n w [bench args...]: shm, host-staged path, -c 1; JSON in $W/tag.json
  local tag=$1 np=$2 size=$3 n=$4 w=$5; shift 5
  timeout 150 $M bench allreduce --backend gpu --transport shm --gpu 0 --np "$np" -b "$size" -e "$size" \
    -n "$n" -w "$w" -c 1 -o json "$@" >"$W/$tag.json" 2>"$W/$tag.err"
  local rc=$?
  say "$tag rc=$rc $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["rows"][0]; print("us=%.1f wrong=%d algo=%s mps=%s limit=%.1f %%limit=%.1f binding=%s" % (r["timeUs"], r["wrong"], d.get("algorithm"), d.get("mps", False), r.get("limitUs", 0), r.get("pctLimit", 0), r.get("limitBinding")))' "$W/$tag.json" 2>/dev/null || tail -c 300 "$W/$tag.err")"
}
coll() { # tag binary np collective [bench args...]: one `migctl bench COLLECTIVE` of ranks on GPU 0 (shm, -c 1),
  # its rows as bytes:mean us,%limit,wrong
  local tag=$1 bin=$2 np=$3 c=$4; shift 4
  timeout 100 $bin bench "$c" --backend gpu --transport shm --gpu 0 --np "$np" -c 1 -o json "$@" >"$W/$tag.json" 2>"$W/$tag.err"
  say "$tag rc=$? $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join("%dB:%.1fus,%.0f%%lim,w%d" % (r["bytes"], r["timeUs"], r.get("pctLimit", 0), r["wrong"]) for r in d["rows"]))' "$W/$tag.json" 2>/dev/null || tail -c 300 "$W/$tag.err")"
}
check() { # tag np timeout args...: a Python check under migctl run, ranks on GPU 0; its ranks' JSON lines with
  # "failures": [] counted, and rank 0's checks / chained / total_ms where it prints them
  local tag=$1 np=$2 t=$3; shift 3
  timeout $((t + 20)) $M run --gpus 0 --np "$np" -q --timeout "${t}s" -- python3 "$@" >"$W/$tag.out" 2>&1
  say "$tag rc=$? clean ranks: $(grep -c '"failures": \[\]' "$W/$tag.out") of $np $(grep -o '"checks": [0-9]*\|"chained": [0-9]*\|"total_ms": [0-9.]*' "$W/$tag.out" | head -3 | tr '\n' ' ')"
}
losses() { # label gloo.json migctl.json...: max |migctl - gloo| over the first losses of DDP runs (ddp's JSON)
  local label=$1; shift
  say "$label losses, max |migctl - gloo|: $(python3 -c '
import json, sys
def l(p):
    try: return json.loads(open(p).readline())["losses"]
    except Exception: return None
g = l(sys.argv[1])
print(" ".join("n/a" if (a := l(p)) is None or g is None else "%.3g" % max(abs(x - y) for x, y in zip(a, g)) for p in sys.argv[2:]))
' "$@")"
}
chainab() { # tag model batch [args...]: ddp over migctl with chained all-reduces (TAG-chain), then without
  # (MIGCTL_TUNING=chain=off, TAG-off)
  local tag=$1; shift
  ddp "$tag-chain" "$1" "$2" migctl "${@:3}"
  MIGCTL_TUNING=chain=off ddp "$tag-off" "$1" "$2" migctl "${@:3}"
}
ddp() { # tag model batch backend [args...]: a DDP run of examples/pytorch, 7 ranks on GPU 0, 25 steps; skipped
  # once the script has run DDP_DEADLINE seconds (default: never); PIN: a command put before python3;
  # TREE: where examples/ and python/ are (default: this checkout; another build's with its MIGCTL_LIB)
  [ "$SECONDS" -lt "${DDP_DEADLINE:-1000000}" ] || { say "$1 skipped (time)"; return; }
  timeout 80 $M run --gpus 0 --np 7 -q -- ${PIN:-} python3 "${TREE:-.}/examples/pytorch/ddp_$2.py" --backend "$4" --batch "$3" --steps 25 "${@:5}" \
    2>"$W/$1.err" | sed -n 's/^\[0\]: \({.*}\)$/\1/p' >"$W/$1.json"
  say "$1 rc=$? $(python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); c=r.get("cpu_ms_per_step") or [0]; print("ms/step=%.1f identical=%s cpu_ms/step(mean,max)=%.1f,%.1f%s" % (r["step_ms_median_slowest_rank"], r["ranks_identical"], sum(c)/len(c), max(c), "".join(" %s=%d" % kv for kv in r.get("library", {}).items())))' "$W/$1.json" 2>/dev/null)"
}
ovh() { # label [VAR=value...]: the PyTorch per-call probe (python/tests/overhead_check.py), NP ranks
  # (default 7), CUDA tensors, the slowest rank's figures
  local label=$1 out; shift
  OVH_N=$((${OVH_N:-0} + 1)); out=$W/ovh-$OVH_N.out
  env N=1000 ROUNDS=5 "$@" timeout 90 $M run --gpus 0 --np "${NP:-7}" -q --timeout 60s -- \
    ${PIN:-} python3 "${TREE:-.}/python/tests/overhead_check.py" --device cuda >"$out" 2>&1
  say "ovh np=${NP:-7} $label rc=$? $(sed -n 's/^\[[0-9]*\]: \({.*}\)$/\1/p' "$out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print(" ".join(f"{k}={max(r[k] for r in rows):.1f}" for k in ("process_group_us", "sync_pg_us", "c_abi_us", "c_run_us", "python_only_us") if rows and k in rows[0]))
for m in ("process_group", "c_run"):
    if rows and m in rows[0].get("lib", {}):
        libs = [r["lib"][m] for r in rows]
        print(f" | {m} lib: " + " ".join(f"{k}={max(x.get(k, 0) for x in libs):.2f}" for k in ("queue_us", "run_us", "wake_us", "direct")), end="")
    s = [r["sched"][m] for r in rows if m in r.get("sched", {})]
    if s:
        print(f" | {m}: " + " ".join(f"{k}={max(x[k] for x in s):.2f}" for k in s[0]), end="")')"
}
pp() { # tag backend [VAR=value...]: one-way point-to-point times through torch send/recv (scripts/p2p_bench.py),
  # 2 ranks on GPU 0, PP_ITERS messages per size (default 100)
  local tag=$1 b=$2; shift 2
  env "$@" timeout 120 $M run --gpus 0 --np 2 -q --timeout 60s -- python3 scripts/p2p_bench.py --backend $b \
    --iters "${PP_ITERS:-100}" --sizes 8KiB,256KiB,4MiB,64MiB >"$W/$tag.out" 2>&1
  say "$tag rc=$? $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/$tag.out" | python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); print(" ".join("%dB:%.1fus,%.2fGB/s" % (x["bytes"], x["one_way_us"], x["gbps"]) for x in r["rows"]))' 2>/dev/null || tail -c 300 "$W/$tag.out")"
}
newold() { # fn [bench args...]: fn TAG BINARY NP [args] for this build (bin/migctl) and the build before
  # (bin/migctl-old), 2 and 7 ranks, interleaved, two rounds; then 2 ranks in place (--inplace) once each
  local fn=$1 i np; shift
  for i in 1 2; do
    for np in 2 7; do
      $fn "new-np$np-$i" bin/migctl $np "$@"
      $fn "old-np$np-$i" bin/migctl-old $np "$@"
    done
  done
  $fn new-np2-inplace bin/migctl 2 --inplace "$@"
  $fn old-np2-inplace bin/migctl-old 2 --inplace "$@"
}
