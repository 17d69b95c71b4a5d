#!/usr/bin/env bash
# Issue 10 on one H200 (lead's GPU call): compute priority through `migctl daemon --mps`.
#  A. preemption delay of a best-effort kernel (PTX, ~50-ms grids of 25-us blocks) seen by a
#     high-priority process's tiny kernel every ~1 ms, both processes under the shim and a
#     `migctl daemon` (priority 10 vs 0): without MPS (time-sliced contexts: the peer), and with
#     --mps (the shim joins the daemon's MPS server, best effort at below-normal client
#     priority), unsliced and sliced (MIGSWAP_SLICE_BLOCKS=1, whole waves, 2 in flight).
#     delay = p99.9 - p50 of the same probe alone (under the same daemon).
#  B. the priority bench, ResNet-50 b1 replayed as a CUDA graph (GPU-bound) every 10 ms vs
#     ResNet-18 b32 training: a b c (alone, alone, uncontrolled) g (--mps) e1 (--gate gate)
#     g1 (--mps --gate gate).
#  C. the same with the issue's eager ResNet-50 b1 (launch-bound): a b c g.
# Knobs: SKIP_A=1, GRAPH_CASES, EAGER_CASES, GRAPH2_ARGS (a second graph run, e.g. "--cases g2 --mps-low-sm 30").
# Needs bin/migctl, bin/libmigswap.so, bin/migswap_ptxslicetest (make build shim), nvcc.
# Logs under $OUT/prio-mps/ (small files only). The MPS control daemons are migctl's (pipes next
# to its private socket), stopped with it; nothing on the GPU is reconfigured.
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp}/prio-mps
mkdir -p "$O"
W=$(mktemp -d /tmp/pm.XXXXXX)
T=bin/migswap_ptxslicetest
SHIM=$PWD/bin/libmigswap.so
SECS=${SECS:-3}
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
"$NVCC" -ptx -arch=compute_90 -O3 -o "$W/k.ptx" shim/test/testdata/ptxslice/slicekern.cu 2>"$O/nvcc.err" || cp shim/test/testdata/ptxslice/slicekern.ptx "$W/k.ptx"

DPID=""
daemon_up() { # args...: a migctl daemon with a private socket pair
  rm -rf "$W/d"; mkdir -p "$W/d"
  bin/migctl daemon --swap-socket "$W/d/s.sock" --socket "$W/d/c.sock" "$@" >"$O/daemon-$TAG.log" 2>&1 &
  DPID=$!
  for _ in $(seq 100); do [ -S "$W/d/s.sock" ] && break; sleep 0.1; done
  [ -S "$W/d/s.sock" ] || { echo "  daemon did not start: $(tail -c 300 "$O/daemon-$TAG.log")"; return 1; }
}
daemon_down() { [ -n "$DPID" ] && kill "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null; DPID=""; }
trap daemon_down EXIT
S() { echo "LD_PRELOAD=$SHIM MIGSWAP_SOCKET=$W/d/s.sock MIGSWAP_LOG=1 $*"; }
xrun() { # label "be env" "hp env"
  local label=$1 beenv=$2 hpenv=$3
  env $beenv MIGSWAP_JOB=be timeout 60 $T gpu-delay "$W/k.ptx" beonly "$((SECS + 2))" 25 0 >"$W/$label-be.txt" 2>"$W/$label-be.err" &
  local be=$!
  sleep 1.5
  env $hpenv MIGSWAP_JOB=hp timeout 60 $T gpu-delay "$W/k.ptx" alone "$SECS" 25 0 >"$W/$label.txt" 2>"$W/$label.err"
  wait $be
  local d; d=$(grep ^DELAY "$W/$label.txt" | grep -o 'samples=.*max_us=[0-9.]*')
  echo "  $label: $d | be $(grep ^DELAY "$W/$label-be.txt" | grep -o 'be_kernels_per_s=[0-9.]*') $(grep ^SLICESTATS "$W/$label-be.txt" | grep -o 'slices=[0-9]*') | mps: $(grep -h -o 'CUDA_MPS_CLIENT_PRIORITY=[0-9]' "$W/$label-be.err" "$W/$label.err" | tr '\n' ' ')" | tee -a "$O/delay.txt"
  cp "$W/$label.txt" "$O/" 2>/dev/null
}
alone() { # label env
  env $2 MIGSWAP_JOB=hp timeout 60 $T gpu-delay "$W/k.ptx" alone "$SECS" 25 0 >"$W/$1.txt" 2>"$W/$1.err"
  echo "  $1: $(grep ^DELAY "$W/$1.txt" | grep -o 'samples=.*max_us=[0-9.]*')" | tee -a "$O/delay.txt"
}
if [ "${SKIP_A:-0}" != 1 ]; then
echo "== A. preemption delay, two processes under the shim and migctl daemon (prio 10 vs 0)" | tee "$O/delay.txt"
TAG=nomps; daemon_up --gate off && {
  alone nomps-alone "$(S MIGSWAP_PRIORITY=10)"
  xrun nomps-unsliced "$(S MIGSWAP_PRIORITY=0)" "$(S MIGSWAP_PRIORITY=10)"
  xrun nomps-sliced-q2 "$(S MIGSWAP_PRIORITY=0 MIGSWAP_SLICE_BLOCKS=1 MIGSWAP_SLICE_INFLIGHT=2)" "$(S MIGSWAP_PRIORITY=10)"
}
daemon_down
TAG=mps; daemon_up --gate off --mps && {
  alone mps-alone "$(S MIGSWAP_PRIORITY=10)"
  xrun mps-unsliced "$(S MIGSWAP_PRIORITY=0)" "$(S MIGSWAP_PRIORITY=10)"
  xrun mps-sliced-q2 "$(S MIGSWAP_PRIORITY=0 MIGSWAP_SLICE_BLOCKS=1 MIGSWAP_SLICE_INFLIGHT=2)" "$(S MIGSWAP_PRIORITY=10)"
  xrun mps-unsliced-equal "$(S MIGSWAP_PRIORITY=10)" "$(S MIGSWAP_PRIORITY=10)"
}
ls -la "$W/d/s.sock.mps" 2>&1 | head -8 | tee "$O/mps-dir.txt"
tail -n 6 "$W/d/s.sock.mps/log/control.log" 2>/dev/null | tee "$O/mps-control-log.txt"
daemon_down
grep -h "MPS\|mps" "$O"/daemon-mps.log | head -5
fi

PB() { # tag budget args...
  local tag=$1 budget=$2; shift 2
  timeout -k 10 $((budget + 30)) python3 scripts/priority_bench.py drive --out "$W/$tag" --bin bin \
    --duration ${DURATION:-8} --budget "$budget" --startup-timeout 60 "$@" >"$O/$tag.txt" 2>&1
  local rc=$?
  cp "$W/$tag/table.md" "$O/$tag-table.md" 2>/dev/null
  grep -E "^\| |^(PASS|FAIL|SKIP|TARGET) " "$O/$tag.txt" || tail -n 20 "$O/$tag.txt"
  echo "  ($tag rc=$rc)"
}
echo "== B. priority bench, ResNet-50 b1 as a CUDA graph"
PB graph ${GRAPH_BUDGET:-200} --infer-graph --cases ${GRAPH_CASES:-a,b,c,g,e1,g1}
if [ -n "${GRAPH2_ARGS:-}" ]; then
  echo "== B2. priority bench, graph inference: $GRAPH2_ARGS"
  PB graph2 ${GRAPH2_BUDGET:-60} --infer-graph $GRAPH2_ARGS
fi
echo "== C. priority bench, eager ResNet-50 b1 (the issue's workload)"
PB eager ${EAGER_BUDGET:-130} --cases ${EAGER_CASES:-a,b,c,g}
rm -rf "$W"
echo "prio-mps: done $(date -u +%T)"
