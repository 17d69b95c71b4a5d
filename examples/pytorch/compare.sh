#!/usr/bin/env bash
# The issue's side-by-side table in one run: DDP ResNet-18 and the small GPT, each at a
# compute-heavy and a communication-heavy batch, with --backend migctl, gloo and none (the same
# processes without communication: the bound), and lockstep (none --lockstep: no gradients, but
# a barrier per step, so every step waits for the slowest rank: the bound of any synchronous
# job), NP ranks on GPU(s) GPUS under `migctl run`.
# One JSON line per run (rank 0's report) goes to OUT; a summary table at the end.
#   examples/pytorch/compare.sh                 # 7 ranks on GPU 0, bin/migctl
#   NP=2 GPUS=0,1 BACKENDS="migctl nccl none" examples/pytorch/compare.sh
#   SYNC_EVERY=5 examples/pytorch/compare.sh    # the host waits for the GPU every 5 steps (--sync-every)
set -euo pipefail
cd "$(dirname "$0")/../.."
MIGCTL=${MIGCTL:-bin/migctl}
PY=${PY:-python3}
NP=${NP:-7}
GPUS=${GPUS:-0}
STEPS=${STEPS:-60}
SYNC_EVERY=${SYNC_EVERY:-1}
BACKENDS=${BACKENDS:-"migctl gloo none lockstep"}
OUT=${OUT:-pytorch-compare-$(date +%Y%m%d-%H%M%S).jsonl}
export MIGCTL_LIB=${MIGCTL_LIB:-$PWD/bin/libmigctl.so}
run() { # model batch backend [args...]
  local model=$1 batch=$2 backend=$3; shift 3
  echo "== $model batch $batch backend $backend" >&2
  "$MIGCTL" run --gpus "$GPUS" --np "$NP" -q -- "$PY" "examples/pytorch/ddp_$model.py" \
    --backend "$backend" --batch "$batch" --steps "$STEPS" --sync-every "$SYNC_EVERY" "$@" | sed -n 's/^\[0\]: \({.*}\)$/\1/p' | tee -a "$OUT"
}
for b in $BACKENDS; do
  set -- "$b"; [ "$b" = lockstep ] && set -- none --lockstep
  run resnet 32 "$@"; run resnet 8 "$@"; run gpt 32 "$@"; run gpt 4 "$@"
done
"$PY" - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    if r.get("lockstep"):
        r["backend"] = "lockstep"
bound = {(r["model"], r["batch_per_rank"]): r["step_ms_slowest_rank"] for r in rows if r["backend"] == "none"}
lock = {(r["model"], r["batch_per_rank"]): r["step_ms_slowest_rank"] for r in rows if r["backend"] == "lockstep"}
print(f"{'model':8} {'batch':>5} {'backend':8} {'ms/step':>9} {'steps/s':>8} {'% bound':>8} {'exposed ms':>10} "
      f"{'% lockstep':>10}  ranks equal")
for r in rows:
    key = (r["model"], r["batch_per_rank"])
    b, lk = bound.get(key), lock.get(key)
    ms = r["step_ms_slowest_rank"]
    pct = f"{100 * b / ms:.0f}%" if b else "-"
    exp = f"{ms - b:.1f}" if b else "-"
    pl = f"{100 * lk / ms:.0f}%" if lk else "-"
    print(f"{r['model']:8} {r['batch_per_rank']:>5} {r['backend']:8} {ms:9.1f} {r['steps_per_s']:8.2f} {pct:>8} {exp:>10} "
          f"{pl:>10}  {r['ranks_identical']}")
by = {}
for r in rows:
    by.setdefault((r["model"], r["batch_per_rank"]), {})[r["backend"]] = r["losses"]
for k, v in by.items():
    if "migctl" in v and "gloo" in v:
        d = max(abs(a - b) for a, b in zip(v["migctl"], v["gloo"]))
        print(f"{k[0]} batch {k[1]}: max |loss migctl - loss gloo| over the first {len(v['migctl'])} steps = {d:.3g}")
PY
echo "raw: $OUT" >&2
