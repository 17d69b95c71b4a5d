#!/usr/bin/env bash
# Issues 9 and 11 on one H200: do the ranks' CUDA contexts time-slicing the GPU cost the one-GPU
# rows their fixed per-round time? Same rows with and without a private MPS server (one shared GPU
# context for all ranks, as MIG instances have their own engines and never switch):
#  A. migctl bench allreduce, shm host-staged, GPU 0: 7 and 2 ranks at 256 MiB (-c 1), 8 KiB;
#     gloo in the same call (CUDA tensors), without and with MPS;
#  B. the PyTorch backend's per-call overhead, 8 KiB, 7 ranks and 1, under MPS (overhead_check.py);
#  C. DDP (examples/pytorch/compare.sh rows) under MPS: ResNet-18 b8 and GPT b4, migctl/gloo/none.
# The MPS control daemon is a private one (pipes under a temp dir) and quits at the end; nothing on
# the GPU is reconfigured. Needs bin/migctl, bin/libmigctl.so, bin/gloo_allreduce.py.
# Logs: $OUT/mps-coll/ (small files). Knobs: SKIP_A, SKIP_B, SKIP_C, CASES_C="resnet:8 gpt:4".
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp}/mps-coll; mkdir -p "$O"
W=$(mktemp -d /tmp/mc.XXXXXX)
M=bin/migctl
export MIGCTL_LIB=$PWD/bin/libmigctl.so PYTHONUNBUFFERED=1
S=$O/summary.txt; : >"$S"
say() { echo "$*" | tee -a "$S"; }
mps_up() {
  export CUDA_MPS_PIPE_DIRECTORY=$W/mps CUDA_MPS_LOG_DIRECTORY=$W/mpslog
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && say "mps: up ($CUDA_MPS_PIPE_DIRECTORY)"
}
mps_down() {
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] || return 0
  echo quit | nvidia-cuda-mps-control; sleep 1
  tail -n 3 "$CUDA_MPS_LOG_DIRECTORY/control.log" >"$O/mps-control-tail.txt" 2>/dev/null
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
trap mps_down EXIT
row() { # tag np size n w [args...]
  local tag=$1 np=$2 size=$3 n=$4 w=$5; shift 5
  timeout 120 $M bench allreduce --backend gpu --transport shm --gpu 0 --np "$np" -b "$size" -e "$size" \
    -n "$n" -w "$w" -c 1 -q -o json "$@" >"$O/$tag.json" 2>"$O/$tag.err"
  local rc=$?
  say "$tag rc=$rc $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["rows"][0]; print("us=%.1f wrong=%d algo=%s limit=%s" % (r["timeUs"], r["wrong"], r.get("rowAlgorithm"), r.get("limitUs")))' "$O/$tag.json" 2>/dev/null || tail -c 300 "$O/$tag.err")"
}
gloo() { # tag
  timeout 200 python3 bin/gloo_allreduce.py --np 2,7 --sizes 8K,256M --iters 5 >"$O/$1.txt" 2>"$O/$1.err"
  say "$1 rc=$?"; grep '^gloo' "$O/$1.txt" | tee -a "$S"
}
A() { # suffix
  row "r7-256M$1" 7 256MiB 10 3
  row "r2-256M$1" 2 256MiB 10 3
  row "r7-8K$1" 7 8KiB 2000 200
  row "r2-8K$1" 2 8KiB 2000 200
}
if [ "${SKIP_A:-0}" != 1 ]; then
  say "== A. bench rows, no MPS"; A ""; gloo gloo
fi
mps_up
if [ "${SKIP_A:-0}" != 1 ]; then
  say "== A. bench rows, MPS"; A "-mps"; gloo gloo-mps
fi
if [ "${SKIP_B:-0}" != 1 ]; then
  say "== B. per-call overhead under MPS"
  for np in 7 1; do
    N=1000 ROUNDS=5 timeout 90 $M run --gpus 0 --np $np -q --timeout 60s -- \
      python3 python/tests/overhead_check.py --device cuda --breakdown >"$O/ovh-np$np.out" 2>"$O/ovh-np$np.err"
    say "ovh np=$np rc=$?"
    sed -n 's/^\[[0-9]*\]: \({.*}\)$/\1/p' "$O/ovh-np$np.out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
for k in ("process_group_us", "c_abi_us", "python_only_us"):
    v = [r[k] for r in rows if k in r]
    if v: print(f"  {k}: slowest rank {max(v):.1f} us, median rank {sorted(v)[len(v)//2]:.1f}")' | tee -a "$S"
  done
fi
if [ "${SKIP_C:-0}" != 1 ]; then
  say "== C. DDP under MPS (7 ranks, GPU 0)"
  for c in ${CASES_C:-resnet:8 gpt:4}; do
    for b in migctl gloo none; do
      [ $SECONDS -lt ${C_DEADLINE:-500} ] || { say "C: out of time before $c $b"; break 2; }
      timeout 150 $M run --gpus 0 --np 7 -q -- python3 "examples/pytorch/ddp_${c%%:*}.py" --backend $b \
        --batch "${c##*:}" --steps ${STEPS:-30} >"$W/c.out" 2>"$O/c-${c%%:*}${c##*:}-$b.err"
      say "C ${c%%:*} b${c##*:} $b rc=$? $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/c.out" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("ms/step=%.1f steps/s=%.2f equal=%s" % (r["step_ms_slowest_rank"], r["steps_per_s"], r["ranks_identical"]))' 2>/dev/null)"
    done
  done
fi
mps_down
say "done in ${SECONDS}s"
