#!/usr/bin/env bash
# Issues 9 and 11 on one H200 (night session, call 3): with this build's defaults (`--mps auto`: a
# private MPS server for ranks sharing GPU 0; `--chunk auto`: allreduce.Staged), in one call:
#  1. host memory under DMA (scripts/h200-session.d/limits-hostmem.sh);
#  2. the one-GPU rows (-c 1): 256 MiB 7 and 2 ranks (twice, and once with --mps off), 8 KiB 7/2/1
#     ranks and 7 ranks with longer --spin;
#  3. gloo in the same call (CUDA tensors, no MPS);
#  4. DDP, 7 ranks on GPU 0 (examples/pytorch, migctl run: auto MPS for every backend): ResNet-18 b8
#     and GPT b4 with migctl / gloo / none, and migctl with --mps off;
#  5. every collective checked (scripts/gpu-collectives-check.sh: bench's default is --mps auto).
# Needs bin/migctl, bin/libmigctl.so, bin/gloo_allreduce.py. Output: $OUT/night/summary.txt, logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init night
if [ "${SKIP_LIMITS:-0}" != 1 ]; then
  say "== 1. host memory under DMA"
  OUT=$W timeout 120 bash scripts/h200-session.d/limits-hostmem.sh >"$W/limits-hostmem.txt" 2>&1
  tail -n 12 "$W/limits-hostmem.txt" | tee -a "$S"
fi
say "== 2. one-GPU rows, defaults (auto MPS, auto chunk)"
for rep in 1 2; do
  row "r7-256M-$rep" 7 256MiB 10 3
  row "r2-256M-$rep" 2 256MiB 10 3
done
row r7-256M-mpsoff 7 256MiB 10 3 --mps off
row r2-256M-mpsoff 2 256MiB 10 3 --mps off
row r2-256M-c4M 2 256MiB 10 3 --chunk 4MiB
for rep in 1 2; do
  row "r7-8K-$rep" 7 8KiB 2000 200
  row "r2-8K-$rep" 2 8KiB 2000 200
done
row r1-8K 1 8KiB 2000 200
for sp in 100us 300us 1ms; do row "r7-8K-spin$sp" 7 8KiB 2000 200 --spin $sp; done
say "== 3. gloo"
timeout 200 python3 bin/gloo_allreduce.py --np 2,7 --sizes 8K,256M --iters 5 >"$W/gloo.txt" 2>"$W/gloo.err"
grep '^gloo' "$W/gloo.txt" | tee -a "$S"
say "== 4. DDP, 7 ranks on GPU 0 (steps 30)"
ddp() { # model batch backend [run args...]
  local model=$1 batch=$2 b=$3; shift 3
  [ $SECONDS -lt ${DDP_DEADLINE:-420} ] || { say "DDP: out of time before $model $batch $b $*"; return; }
  timeout 150 $M run --gpus 0 --np 7 "$@" -- python3 "examples/pytorch/ddp_$model.py" --backend $b \
    --batch "$batch" --steps ${STEPS:-30} >"$W/ddp-$model$batch-$b$*.out" 2>&1
  local rc=$?
  sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/ddp-$model$batch-$b$*.out" >>"$W/ddp.jsonl"
  say "ddp $model b$batch $b $* rc=$rc $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/ddp-$model$batch-$b$*.out" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("ms/step=%.1f steps/s=%.2f equal=%s" % (r["step_ms_slowest_rank"], r["steps_per_s"], r["ranks_identical"]))' 2>/dev/null) $(grep -h -o 'MPS: [a-z0-9 ]*' "$W/ddp-$model$batch-$b$*.out" | head -1)"
}
for c in resnet:8 gpt:4; do
  for b in migctl gloo none; do ddp ${c%%:*} ${c##*:} $b; done
  ddp ${c%%:*} ${c##*:} migctl --mps off
done
if [ "${SKIP_CHECK:-0}" != 1 ] && [ $SECONDS -lt 450 ]; then
  say "== 5. every collective, bench defaults (MPS)"
  OUT=$W/check timeout $((570 - SECONDS)) bash scripts/gpu-collectives-check.sh >"$W/check.txt" 2>&1
  grep -E "FAIL|passed" "$W/check.txt" | tail -n 8 | tee -a "$S"
fi
