#!/usr/bin/env bash
# Issues 9 and 11 on one H200, one call: the one-GPU rows with `migctl bench --mps off` (the driver
# time-slices the ranks' contexts) and --mps on (a private MPS server, what --mps auto now picks),
# interleaved so that both see the same machine; gloo in the same call; a tuning grid under MPS;
# traces of the 8-KiB and 256-MiB rows; every collective checked under MPS
# (scripts/gpu-collectives-check.sh: bench's default is now --mps auto); the PyTorch per-call probe
# and stream-order checks under `migctl run` (auto MPS).
# Needs bin/migctl, bin/libmigctl.so, bin/gloo_allreduce.py. Output: $OUT/mps-rows/summary.txt and
# one logs.tgz. Knobs: SKIP_GRID, SKIP_CHECK, SKIP_TORCH, REPS (default 2).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init mps-rows
nproc >>"$S"
mrow() { row "$@"; grep -h "MPS" "$W/$1.err" | head -1 >>"$S"; }
say "== A. one-GPU rows, --mps off / on interleaved (-c 1)"
bin/migctl bench limits -o json >"$W/limits.json" 2>&1
for rep in $(seq ${REPS:-2}); do
  for m in off on; do
    mrow "r7-256M-$m-$rep" 7 256MiB 10 3 --mps $m
    mrow "r2-256M-$m-$rep" 2 256MiB 10 3 --mps $m
    mrow "r7-8K-$m-$rep" 7 8KiB 2000 200 --mps $m
    mrow "r2-8K-$m-$rep" 2 8KiB 2000 200 --mps $m
  done
done
say "== B. gloo (CUDA tensors, no MPS)"
timeout 200 python3 bin/gloo_allreduce.py --np 2,7 --sizes 8K,256M --iters 5 >"$W/gloo.txt" 2>"$W/gloo.err"
grep '^gloo' "$W/gloo.txt" | tee -a "$S"
if [ "${SKIP_GRID:-0}" != 1 ]; then
  say "== C. grid under MPS, 7 and 2 ranks, 256 MiB"
  for c in "2MiB 8" "4MiB 16" "8MiB 8" "8MiB 16"; do
    set -- $c
    mrow "g7-c$1-s$2" 7 256MiB 10 3 --mps on --chunk $1 --slots $2
  done
  mrow g7-c4MiB-s8-d4 7 256MiB 10 3 --mps on --depth 4
  mrow g7-c4MiB-s8-w2 7 256MiB 10 3 --mps on --reduce-workers 2
  mrow g7-c4MiB-s8-w4 7 256MiB 10 3 --mps on --reduce-workers 4
  for c in "8MiB 8" "16MiB 8" "4MiB 16"; do
    set -- $c
    mrow "g2-c$1-s$2" 2 256MiB 10 3 --mps on --chunk $1 --slots $2
  done
  mrow g2-c4MiB-s8-d4 2 256MiB 10 3 --mps on --depth 4
  mrow g2-c4MiB-s8-w8 2 256MiB 10 3 --mps on --reduce-workers 8
fi
say "== D. traces (MIGCTL_TRACE=1, rank 0's summary in logs.tgz)"
for m in off on; do
  MIGCTL_TRACE=1 row "t7-8K-$m" 7 8KiB 500 50 --mps $m
  MIGCTL_TRACE=1 row "t2-8K-$m" 2 8KiB 500 50 --mps $m
done
MIGCTL_TRACE=1 row t7-256M-on 7 256MiB 5 2 --mps on
if [ "${SKIP_CHECK:-0}" != 1 ]; then
  say "== E. every collective under MPS (bench's default --mps auto)"
  OUT=$W/check timeout 300 bash scripts/gpu-collectives-check.sh >"$W/check.txt" 2>&1
  grep -E "FAIL|passed" "$W/check.txt" | tee -a "$S"
fi
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  say "== F. PyTorch under migctl run (auto MPS): stream order and per-call cost, 7 ranks"
  timeout 90 $M run --gpus 0 --np 7 --timeout 50s -- python3 python/tests/gpu_checks.py >"$W/gpu_checks.out" 2>&1
  say "gpu_checks rc=$? $(grep -h 'MPS' "$W/gpu_checks.out" | head -1)"
  grep -h '"failures"' "$W/gpu_checks.out" | head -1 | cut -c 1-300 >>"$S"
  for np in 7 1; do
    N=1000 ROUNDS=5 timeout 90 $M run --gpus 0 --np $np -q --timeout 60s -- \
      python3 python/tests/overhead_check.py --device cuda --breakdown >"$W/ovh-np$np.out" 2>"$W/ovh-np$np.err"
    say "ovh np=$np rc=$?"
    sed -n 's/^\[[0-9]*\]: \({.*}\)$/\1/p' "$W/ovh-np$np.out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
for k in ("process_group_us", "c_abi_us", "python_only_us"):
    v = [r[k] for r in rows if k in r]
    if v: print(f"  {k}: slowest rank {max(v):.1f} us")
if rows: print("  rank0:", json.dumps(rows[0])[:900])' | tee -a "$S"
  done
fi
