#!/usr/bin/env bash
# sched-policy (helper H3, issue 10 D4) for the lead's GPU call: `migctl daemon --policy fair` on
# GPU 0 with the real shim. A ballast process (no shim) holds most of the H200 so that two
# equal-priority shimmed jobs of JOB_GIB each (matmul loops, progress every second) do not fit
# together: the second one's allocation fails, its need makes the daemon swap the first out, and
# then the two take turns of one quantum (20 x the cost model's swap out and in of JOB_GIB at
# 47 GiB/s + 10 ms, at least --quantum: ~17 s for 20 GiB). Reports each job's matmul iterations while both were active (fair: equal),
# the switches, and the swap time as a share of the run (the quantum rule keeps it ~<5%).
# Needs bin/migctl, bin/libmigswap.so (make build shim), python3 + torch. MIG off; read-only
# nvidia-smi. Logs under $OUT/sched-policy/. Last lines: PASS/FAIL lines and a summary. < 4 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp}/sched-policy; mkdir -p "$O"
JOB_GIB=${JOB_GIB:-20} RUN_S=${RUN_S:-150} STAGGER_S=${STAGGER_S:-8}
for f in bin/migctl bin/libmigswap.so; do [[ -e $f ]] || { echo "FAIL missing $f (make build shim)"; exit 2; }; done
nvidia-smi --query-gpu=name,memory.total,memory.used,mig.mode.current --format=csv,noheader | tee "$O/gpu.txt"
S=$(mktemp -d /tmp/h3s.XXXXXX)
cleanup() { kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$S"; }
pids=(); trap cleanup EXIT

cat >"$O/ballast.py" <<'PY'
import sys, time, torch
free, total = torch.cuda.mem_get_info()
keep = int(sys.argv[1]) << 30                     # leave this much free for the two jobs
x = torch.empty(max(free - keep, 0), dtype=torch.uint8, device="cuda")
print(f"ballast holds {x.numel() / 2**30:.1f} GiB, leaves {torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB free", flush=True)
time.sleep(float(sys.argv[2]))
PY
cat >"$O/job.py" <<'PY'
import json, sys, time, torch
gib, run_s, name = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
t0 = time.time()
x = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")   # the job's memory (may wait on a need)
x.fill_(7)
a = torch.randn(2048, 2048, device="cuda"); b = torch.randn(2048, 2048, device="cuda")
print(json.dumps({"job": name, "allocated_after_s": round(time.time() - t0, 2)}), flush=True)
n, last = 0, time.time()
while time.time() - t0 < run_s:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize(); n += 10
    now = time.time()
    if now - last >= 1:
        print(json.dumps({"job": name, "t": round(now, 3), "iters": n}), flush=True); last = now
ok = bool((x[:: 1 << 20] == 7).all().item())
print(json.dumps({"job": name, "t": round(time.time(), 3), "iters": n, "done": True, "memory_intact": ok}), flush=True)
PY

bin/migctl daemon --policy fair --quantum 10s --swap-socket "$S/swap.sock" --socket "$S/ctl.sock" \
  --state "$S/leases.json" --log-level info >"$O/daemon.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "daemon ready" "$O/daemon.log" && break; sleep 0.1; done
grep -q "daemon ready" "$O/daemon.log" || { echo "FAIL daemon did not start"; tail "$O/daemon.log"; exit 1; }
# Leave 1.5 x JOB_GIB + 2 GiB free: room for one job and both CUDA contexts, not for two jobs.
python3 "$O/ballast.py" $((JOB_GIB * 3 / 2 + 2)) $((RUN_S + STAGGER_S + 30)) >"$O/ballast.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do grep -q "ballast holds" "$O/ballast.log" && break; sleep 0.1; done
cat "$O/ballast.log"
export LD_PRELOAD=$PWD/bin/libmigswap.so MIGSWAP_SOCKET=$S/swap.sock MIGSWAP_PRIORITY=0 MIGSWAP_PREPIN=1
MIGSWAP_JOB=a python3 "$O/job.py" "$JOB_GIB" "$RUN_S" a >"$O/a.log" 2>"$O/a.err" &
ja=$!; pids+=($ja)
sleep "$STAGGER_S"
MIGSWAP_JOB=b python3 "$O/job.py" "$JOB_GIB" "$RUN_S" b >"$O/b.log" 2>"$O/b.err" &
jb=$!; pids+=($jb)
unset LD_PRELOAD
sleep 20; bin/migctl swap status --socket "$S/ctl.sock" >"$O/status-mid.txt" 2>&1
deadline=$((SECONDS + RUN_S + 40))
while { kill -0 "$ja" || kill -0 "$jb"; } 2>/dev/null && ((SECONDS < deadline)); do sleep 1; done
kill -0 "$ja" 2>/dev/null && { echo "job a still running at the deadline: killed"; kill "$ja"; }
kill -0 "$jb" 2>/dev/null && { echo "job b still running at the deadline: killed"; kill "$jb"; }
bin/migctl swap status --socket "$S/ctl.sock" >"$O/status-end.txt" 2>&1
python3 - "$O" "$JOB_GIB" <<'PY'
import json, os, re, sys
o, gib = sys.argv[1], int(sys.argv[2])
def rows(n):
    out = []
    for l in open(os.path.join(o, n + ".log")):
        try: out.append(json.loads(l))
        except ValueError: pass
    return out
a, b = rows("a"), rows("b")
swaps = [dict(re.findall(r'(\w+)=("[^"]*"|\S+)', l)) for l in open(os.path.join(o, "daemon.log")) if 'msg="swap result"' in l]
outs = [s for s in swaps if s.get("dir") == "swap-out" and s.get("ok") == "true"]
ins = [s for s in swaps if s.get("dir") == "swap-in" and s.get("ok") == "true"]
swap_s = sum(float(s.get("seconds", 0)) for s in swaps)
# A process's first swap-out also pins its host arena (seconds per GiB on a fresh VM unless the
# background MIGSWAP_PREPIN has finished; shim/RESULTS-H200.md): counted apart.
first, steady = {}, []
for s in swaps:
    if s.get("dir") == "swap-out" and s.get("pid") not in first:
        first[s.get("pid")] = float(s.get("seconds", 0))
    else:
        steady.append(float(s.get("seconds", 0)))
done = {r["job"]: r for r in a + b if r.get("done")}
# Iterations while both were active: from b's allocation to the first job's end.
ta = [r for r in a if "t" in r]; tb = [r for r in b if "t" in r]
def iters_between(rs, t0, t1):
    inside = [r["iters"] for r in rs if t0 <= r["t"] <= t1]
    return (max(inside) - min(inside)) if len(inside) > 1 else 0
ok = True
def check(cond, what):
    global ok
    ok &= bool(cond); print(("PASS " if cond else "FAIL ") + what)
check(len(done) == 2, f"both jobs finished ({sorted(done)})")
check(all(r.get("memory_intact") for r in done.values()), "memory intact after every swap (a fill pattern checked at the end)")
check(len(outs) >= 3 and len(ins) >= 2, f"jobs took turns: {len(outs)} swap-outs, {len(ins)} swap-ins")
if ta and tb:
    t0, t1 = tb[0]["t"], min(ta[-1]["t"], tb[-1]["t"])
    ia, ib = iters_between(ta, t0, t1), iters_between(tb, t0, t1)
    ratio = min(ia, ib) / max(ia, ib, 1)
    check(ratio >= 0.6, f"equal share while both active ({t1 - t0:.0f} s): a {ia} iters, b {ib} iters, ratio {ratio:.2f} (>= 0.6)")
    share = sum(steady) / max(t1 - t0, 1)
    check(share <= 0.10, f"swap time after each first swap-out {sum(steady):.1f} s = {100 * share:.1f}% of the {t1 - t0:.0f} s both were active (<= 10%)")
    print(f"all swaps {swap_s:.1f} s = {100 * swap_s / max(t1 - t0, 1):.1f}%; first swap-outs (arena pinning) {sorted(first.values())} s")
if steady:
    print(f"swap of {gib} GiB after the first: median {sorted(steady)[len(steady) // 2]:.2f} s, max {max(steady):.2f} s over {len(steady)} swaps")
print("sched-policy:", "PASS" if ok else "FAIL")
PY
