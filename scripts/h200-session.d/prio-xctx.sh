#!/usr/bin/env bash
# Issue 10 on one H200 (lead's GPU call, evening of 2026-12-01): why the preemption delay across
# two processes stays ~1.35 ms, and the priority bench with a GPU-bound high-priority job.
#  A. cross-context scheduling: a high-priority process times a tiny kernel (launch ->
#     cuStreamSynchronize) every ~1 ms next to a best-effort process that (long) runs ~50-ms
#     kernels, (wave) one-wave 25-us kernels back to back, (wave-gap) the same with 200 us idle
#     between them, (idle) one tiny kernel every 100 ms. Tells whether the GPU hands the other
#     context the device when the best-effort context goes idle, or only at its time slice.
#  B. the same under MPS (a private MPS control daemon for this script only: its pipe and log
#     directories are under $OUT, only processes given CUDA_MPS_PIPE_DIRECTORY join it; quit at
#     the end; no GPU setting is changed): unsliced, sliced (MIGSWAP_SLICE_BLOCKS=1, whole waves),
#     and CUDA_MPS_CLIENT_PRIORITY=1 (below normal) for the best-effort client. Skipped when
#     nvidia-cuda-mps-control is not installed.
#  C. the priority bench (scripts/priority_bench.py) with the inference job replayed as a CUDA graph
#     (GPU-bound requests), cases a b c e1 e3 e2; then (MPS present) cases c, e1 under MPS.
# Needs bin/migctl, bin/libmigswap.so, bin/migswap_ptxslicetest (make build shim), nvcc.
# Logs under $OUT/prio-xctx/. Prints DELAY summaries, the bench tables, PASS/FAIL lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp}/prio-xctx
mkdir -p "$O"
T=bin/migswap_ptxslicetest
SHIM=$PWD/bin/libmigswap.so
SECS=${SECS:-3}
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
"$NVCC" -ptx -arch=compute_90 -O3 -o "$O/k.ptx" shim/test/testdata/ptxslice/slicekern.cu 2>"$O/nvcc.err" || cp shim/test/testdata/ptxslice/slicekern.ptx "$O/k.ptx"
SMS=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 && echo 132 || echo 132)
WAVE=$((SMS * 16))

# xrun label "be env" "hp env" blocks spin_us
xrun() {
  local label=$1 beenv=$2 hpenv=$3 blocks=$4 spin=$5
  env $beenv timeout 60 $T gpu-delay "$O/k.ptx" beonly "$((SECS + 2))" "$spin" "$blocks" \
    >"$O/$label-be.txt" 2>"$O/$label-be.err" &
  local be=$!
  sleep 1.5
  env $hpenv timeout 60 $T gpu-delay "$O/k.ptx" alone "$SECS" "$spin" "$blocks" >"$O/$label.txt" 2>"$O/$label.err"
  wait $be
  echo "  $label: $(grep ^DELAY "$O/$label.txt" | grep -o 'samples=.*max_us=[0-9.]*') | be $(grep ^DELAY "$O/$label-be.txt" | grep -o 'be_kernels_per_s=[0-9.]*') $(grep ^SLICESTATS "$O/$label-be.txt" | grep -o 'slices=[0-9]*')" | tee -a "$O/delay.txt"
}
echo "== A. two processes, no MPS (waves of $WAVE blocks)" | tee "$O/delay.txt"
env timeout 60 $T gpu-delay "$O/k.ptx" alone "$SECS" 25 "$WAVE" >"$O/alone.txt" 2>&1
echo "  alone: $(grep ^DELAY "$O/alone.txt" | grep -o 'samples=.*max_us=[0-9.]*')" | tee -a "$O/delay.txt"
xrun long "" "" 0 25
xrun wave "" "" "$WAVE" 25
xrun wave-gap200 "XDELAY_GAP_US=200" "" "$WAVE" 25
xrun wave-gap1000 "XDELAY_GAP_US=1000" "" "$WAVE" 25
xrun idle "XDELAY_GAP_US=100000" "" 1 1
xrun long-sliced-q1 "LD_PRELOAD=$SHIM MIGSWAP_SLICE_BLOCKS=1 MIGSWAP_SLICE_INFLIGHT=1" "" 0 25

MPSCTL=$(command -v nvidia-cuda-mps-control || true)
MPS_OK=0
if [ -n "$MPSCTL" ]; then
  export CUDA_MPS_PIPE_DIRECTORY=$O/mps-pipe CUDA_MPS_LOG_DIRECTORY=$O/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if "$MPSCTL" -d >"$O/mps-start.txt" 2>&1; then
    MPS_OK=1
    trap 'echo quit | CUDA_MPS_PIPE_DIRECTORY='"$O"'/mps-pipe '"$MPSCTL"' >/dev/null 2>&1' EXIT
    echo "== B. two processes under a private MPS server ($MPSCTL)" | tee -a "$O/delay.txt"
    env timeout 60 $T gpu-delay "$O/k.ptx" alone "$SECS" 25 "$WAVE" >"$O/mps-alone.txt" 2>&1
    echo "  mps-alone: $(grep ^DELAY "$O/mps-alone.txt" | grep -o 'samples=.*max_us=[0-9.]*') $(grep -i -m1 'error\|fail' "$O/mps-alone.txt")" | tee -a "$O/delay.txt"
    xrun mps-long "" "" 0 25
    xrun mps-long-lowprio "CUDA_MPS_CLIENT_PRIORITY=1" "" 0 25
    xrun mps-long-sliced-q1 "LD_PRELOAD=$SHIM MIGSWAP_SLICE_BLOCKS=1 MIGSWAP_SLICE_INFLIGHT=1" "" 0 25
    xrun mps-long-sliced-q2 "LD_PRELOAD=$SHIM MIGSWAP_SLICE_BLOCKS=1 MIGSWAP_SLICE_INFLIGHT=2" "" 0 25
    xrun mps-long-sliced-q2-lowprio "LD_PRELOAD=$SHIM MIGSWAP_SLICE_BLOCKS=1 MIGSWAP_SLICE_INFLIGHT=2 CUDA_MPS_CLIENT_PRIORITY=1" "" 0 25
    xrun mps-wave "" "" "$WAVE" 25
    echo "  mps server log: $(tail -n 3 "$CUDA_MPS_LOG_DIRECTORY"/control.log 2>/dev/null | tr '\n' ' ' | head -c 400)"
    echo quit | "$MPSCTL" >/dev/null 2>&1
    sleep 1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  else
    echo "  MPS control daemon did not start: $(head -c 300 "$O/mps-start.txt")" | tee -a "$O/delay.txt"
  fi
else
  echo "== B. skipped: nvidia-cuda-mps-control not installed" | tee -a "$O/delay.txt"
fi

echo "== C. priority bench, inference replayed as a CUDA graph"
PB() { # tag budget cases... (extra args after --)
  local tag=$1 budget=$2; shift 2
  timeout -k 10 $((budget + 30)) python3 scripts/priority_bench.py drive --out "$O/$tag" --bin bin \
    --duration ${DURATION:-8} --budget "$budget" --startup-timeout 60 --infer-graph "$@" >"$O/$tag.txt" 2>&1
  local rc=$?
  grep -E "^\| |^(PASS|FAIL|SKIP|TARGET) " "$O/$tag.txt" || tail -n 20 "$O/$tag.txt"
  echo "  ($tag rc=$rc)"
}
PB graph 230 --cases a,b,c,e1,e3,e2 --budget-n 8 --depth 32
if [ "$MPS_OK" = 1 ] && [ "${SKIP_MPS_BENCH:-0}" != 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=$O/mps-pipe2 CUDA_MPS_LOG_DIRECTORY=$O/mps-log2
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  "$MPSCTL" -d >>"$O/mps-start.txt" 2>&1
  trap 'echo quit | CUDA_MPS_PIPE_DIRECTORY='"$O"'/mps-pipe2 '"$MPSCTL"' >/dev/null 2>&1' EXIT
  echo "== C2. priority bench under MPS (graph inference)"
  PB graph-mps 120 --cases a,c,e1
  echo quit | "$MPSCTL" >/dev/null 2>&1
fi
echo "prio-xctx: done $(date -u +%T)"
