#!/usr/bin/env bash
# Issues 9 and 11 on one H200 (night session, last call), this build's defaults (--mps auto,
# --chunk auto, the one-lane 300-µs spin, AVX2 float32 sums), one call:
#  1. the one-GPU rows (-c 1): 256 MiB 7/2 ranks, 8 KiB 7 (twice, and traced)/2/1 ranks, and a
#     7-rank sweep 4-64 MiB (DDP's bucket sizes);
#  2. gloo (CUDA tensors);
#  3. DDP, 7 ranks on GPU 0 (`migctl run`, auto MPS for every backend): ResNet-18 b8 and GPT b4
#     (50 steps: losses compared) and b32 rows (compute-heavy) with migctl / gloo / none;
#  4. scripts/h200-session.d/torch-overhead2.sh (per-call overhead, stream-order checks) if present;
#  5. ResNet b8 over migctl with 100-MB buckets, one reduce worker, GOMAXPROCS=4, and traced.
# Needs bin/migctl, bin/libmigctl.so, bin/gloo_allreduce.py. Output: $OUT/final/summary.txt, logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init final
say "== 1. one-GPU rows"
bin/migctl bench limits --gpu 0 -o table >"$W/limits.txt" 2>&1
row r7-256M 7 256MiB 10 3
row r2-256M 2 256MiB 10 3
row r7-8K-1 7 8KiB 2000 200
row r7-8K-2 7 8KiB 2000 200
MIGCTL_H2D=plain row r7-8K-h2dplain 7 8KiB 2000 200
row r2-8K 2 8KiB 2000 200
row r1-8K 1 8KiB 2000 200
MIGCTL_TRACE=1 row t7-8K 7 8KiB 1000 100
grep -A4 "hoststaged-small" "$W/t7-8K.err" | cut -c1-220 >>"$S"
timeout 150 $M bench allreduce --backend gpu --transport shm --gpu 0 --np 7 -b 4MiB -e 64MiB -f 2 -n 10 -w 3 -c 1 \
  >"$W/sweep7.txt" 2>"$W/sweep7.err"
say "sweep7 rc=$?"; grep -E "^ *[0-9]" "$W/sweep7.txt" | tee -a "$S"
say "== 2. gloo"
timeout 200 python3 bin/gloo_allreduce.py --np 2,7 --sizes 8K,256M --iters 5 >"$W/gloo.txt" 2>"$W/gloo.err"
grep '^gloo' "$W/gloo.txt" | tee -a "$S"
say "== 3. DDP, 7 ranks on GPU 0"
ddp() { # tag model batch backend steps [script args...]
  local tag=$1 model=$2 batch=$3 b=$4 steps=$5; shift 5
  [ $SECONDS -lt ${DDP_DEADLINE:-440} ] || { say "DDP: out of time before $tag"; return; }
  timeout 150 $M run --gpus 0 --np 7 -- python3 "examples/pytorch/ddp_$model.py" --backend $b \
    --batch "$batch" --steps "$steps" "$@" >"$W/ddp-$tag.out" 2>&1
  local rc=$?
  sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/ddp-$tag.out" | TAG=$tag python3 -c 'import json,os,sys; r=json.loads(sys.stdin.read()); r["tag"]=os.environ["TAG"]; print(json.dumps(r))' >>"$W/ddp.jsonl" 2>/dev/null
  say "ddp $tag rc=$rc $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/ddp-$tag.out" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("ms/step=%.1f steps/s=%.2f equal=%s" % (r["step_ms_slowest_rank"], r["steps_per_s"], r["ranks_identical"]))' 2>/dev/null)"
}
for c in resnet:8 gpt:4; do
  for b in migctl gloo none; do ddp "${c%%:*}${c##*:}-$b" ${c%%:*} ${c##*:} $b 40; done
done
for c in resnet:32 gpt:32; do
  for b in migctl gloo none; do ddp "${c%%:*}${c##*:}-$b" ${c%%:*} ${c##*:} $b 20; done
done
python3 - "$W/ddp.jsonl" <<'PY' | tee -a "$S"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {r["tag"]: r for r in rows}
for m in ("resnet8", "gpt4", "resnet32", "gpt32"):
    g, n, x = by.get(m + "-gloo"), by.get(m + "-none"), by.get(m + "-migctl")
    if not x:
        continue
    line = f"{m}: migctl {x['step_ms_slowest_rank']:.1f} ms"
    if g:
        line += f", gloo {g['step_ms_slowest_rank']:.1f} ({g['step_ms_slowest_rank'] / x['step_ms_slowest_rank']:.2f}x gloo's steps/s)"
    if n:
        line += f", bound {n['step_ms_slowest_rank']:.1f} ({100 * n['step_ms_slowest_rank'] / x['step_ms_slowest_rank']:.0f}% of bound; gloo {100 * n['step_ms_slowest_rank'] / g['step_ms_slowest_rank']:.0f}%)" if g else ""
    if g and x.get("losses") and g.get("losses"):
        d = max(abs(a - b) for a, b in zip(x["losses"], g["losses"]))
        line += f"; max |loss migctl - gloo| over {min(len(x['losses']), len(g['losses']))} steps {d:.3g}"
    line += f"; ranks identical {x['ranks_identical']}"
    print(line)
PY
if [ -f scripts/h200-session.d/torch-overhead2.sh ] && [ $SECONDS -lt 470 ]; then
  say "== 4. per-call overhead (torch-overhead2.sh)"
  OUT=$W timeout $((560 - SECONDS)) bash scripts/h200-session.d/torch-overhead2.sh >"$W/ovh2.txt" 2>&1
  tail -n 15 "$W/ovh2.txt" | tee -a "$S"
fi
say "== 5. DDP ResNet-18 b8 variants (time permitting)"
DDP_DEADLINE=560
ddp resnet8-migctl-b100 resnet 8 migctl 30 --bucket-mb 100
MIGCTL_TUNING=workers=1 ddp resnet8-migctl-w1 resnet 8 migctl 30
GOMAXPROCS=4 ddp resnet8-migctl-gmp4 resnet 8 migctl 30
MIGCTL_TRACE=1 ddp resnet8-migctl-trace resnet 8 migctl 20
grep -h -A6 "hoststaged [0-9]* B" "$W/ddp-resnet8-migctl-trace.out" 2>/dev/null | head -20 | cut -c1-220 >>"$S"
