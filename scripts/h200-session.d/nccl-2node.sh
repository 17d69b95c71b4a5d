#!/usr/bin/env bash
# nccl-2node.sh — issue 9 deliverable 4: a Go group across two "nodes" whose inter-node stage runs
# on NCCL loaded at run time (internal/nccl: dlopen libnccl.so.2, our own prototypes).
#   1. any GPU count: libnccl.so.2 loads (found via MIGCTL_NCCL_LIB, the system path, or the one
#      PyTorch ships in <site-packages>/nvidia/nccl/lib), ncclGetVersion answers, and a
#      one-rank communicator runs AllReduce/Broadcast/AllGather/ReduceScatter on GPU 0 correctly
#      (bin/nccl.test: TestOpenRealLibrary, TestRealLibraryOneRank).
#   2. 2 GPUs or more: two "nodes" on one machine (separate processes reporting hosts node0 and
#      node1, CUDA_VISIBLE_DEVICES=0 and =1), NCCL forced onto its socket transport
#      (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1): 2 nodes x 1 rank and 2 nodes x
#      2 ranks (2 ranks share a GPU: the node-local stage runs over shared memory), every
#      collective checked element by element on every rank, and a timed 256 MiB fp32
#      all-reduce (bin/trainer.test: TestGroupAcrossNodesProcesses with MIGCTL_MN_BACKEND=gpu).
#      With fewer than 2 GPUs this part prints SKIP.
#   3. any GPU count: the same two "nodes" both on GPU 0 (MIGCTL_MN_ONE_GPU=1), each with its own
#      NCCL_HOSTID, so NCCL takes them for two hosts (its duplicate-GPU check is per host) and
#      connects them over NET/Socket: the real library's inter-node path without a second GPU.
#   NCCL's sockets stay on the loopback interface (NCCL_SOCKET_IFNAME=lo).
#
# Runs from the repo root on the GPU machine; needs bin/nccl.test and bin/trainer.test:
#   go test -c -o bin/nccl.test ./internal/nccl && go test -c -o bin/trainer.test ./trainer
# (`make gpu-test` builds both under these names). Writes logs to $OUT/nccl/, prints PASS/FAIL/
# SKIP lines and a summary. Under two minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-./out}/nccl
mkdir -p "$O"
fails=0
B=${BIN:-bin} 
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

# Where libnccl.so.2 is: $MIGCTL_NCCL_LIB, else the system's, else PyTorch's.
if [ -z "${MIGCTL_NCCL_LIB:-}" ]; then
  if ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
    MIGCTL_NCCL_LIB=libnccl.so.2
  else
    tdir=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))" 2>/dev/null)
    for c in "$tdir/../nvidia/nccl/lib/libnccl.so.2" "$tdir/lib/libnccl.so.2"; do
      [ -n "$tdir" ] && [ -f "$c" ] && { MIGCTL_NCCL_LIB=$(readlink -f "$c"); break; }
    done
  fi
fi
if [ -z "${MIGCTL_NCCL_LIB:-}" ]; then
  fail "nccl-find: no libnccl.so.2 (not on the library path, no PyTorch with nvidia/nccl/lib)"
  echo "SUMMARY nccl: NCCL not found"; exit 1
fi
export MIGCTL_NCCL_LIB
[ "$MIGCTL_NCCL_LIB" != libnccl.so.2 ] && export LD_LIBRARY_PATH="$(dirname "$MIGCTL_NCCL_LIB"):${LD_LIBRARY_PATH:-}"
torchnccl=$(python3 -c "import torch; print('.'.join(map(str, torch.cuda.nccl.version())))" 2>/dev/null)
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
{ date -u; git rev-parse --short HEAD 2>/dev/null; echo "MIGCTL_NCCL_LIB=$MIGCTL_NCCL_LIB (torch's NCCL: ${torchnccl:-?})"
  echo "GPUs: $ngpu"; nvidia-smi -L 2>&1; } >"$O/env.txt"
echo "nccl: $MIGCTL_NCCL_LIB, torch's NCCL ${torchnccl:-?}, $ngpu GPU(s)"

for b in "$B/nccl.test" "$B/trainer.test"; do
  [ -x "$b" ] || { fail "binary $b missing (go test -c -o $b ./internal/nccl or ./trainer)"; }
done

# 1. dlopen, version, one-rank collectives on GPU 0.
if [ -x "$B/nccl.test" ]; then
  MIGCTL_NCCL_REQUIRED=1 timeout 120 "$B/nccl.test" -test.v -test.count=1 \
    -test.run '^(TestOpenRealLibrary|TestRealLibraryOneRank)$' >"$O/nccl-test.log" 2>&1
  rc=$?
  ver=$(sed -n 's/.*NCCL \([0-9.]*\) (code \([0-9]*\)) loaded.*/\1 (code \2)/p' "$O/nccl-test.log" | head -1)
  if [ $rc -eq 0 ] && grep -q -- '--- PASS: TestOpenRealLibrary' "$O/nccl-test.log"; then
    pass "nccl-dlopen: ncclGetVersion = ${ver:-?}"
  else
    fail "nccl-dlopen (rc $rc, see $O/nccl-test.log)"; tail -5 "$O/nccl-test.log"
  fi
  if grep -q -- '--- PASS: TestRealLibraryOneRank' "$O/nccl-test.log"; then
    pass "nccl-one-rank: AllReduce/Broadcast/AllGather/ReduceScatter on GPU 0, bad root -> $(grep -o 'root 5 of 1 rank: .*' "$O/nccl-test.log" | head -1 | cut -c1-100)"
  elif grep -q -- '--- SKIP: TestRealLibraryOneRank' "$O/nccl-test.log"; then
    echo "SKIP nccl-one-rank: $(grep -A1 -- '--- SKIP: TestRealLibraryOneRank' "$O/nccl-test.log" | tail -1)"
  else
    fail "nccl-one-rank (see $O/nccl-test.log)"
  fi
fi

# 2 and 3. Two "nodes" over NCCL's sockets: one GPU each, then both on GPU 0.
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO \
  NCCL_DEBUG_SUBSYS=INIT,NET
two_nodes() { # two_nodes NODES PER_NODE ONE_GPU(0|1)
  local name="nccl-2node-${1}x${2}"
  [ "$3" = 1 ] && name="$name-1gpu"
  rm -f "$O"/nccl-debug.*
  NCCL_DEBUG_FILE="$O/nccl-debug.%h.%p" MIGCTL_MN_BACKEND=gpu MIGCTL_MN_REQUIRE=1 MIGCTL_MN_NODES=$1 MIGCTL_MN_PER_NODE=$2 \
    MIGCTL_MN_ONE_GPU=$3 MIGCTL_MN_BYTES=${BYTES:-268435456} timeout 150 "$B/trainer.test" -test.v -test.count=1 \
    -test.run '^TestGroupAcrossNodesProcesses$' >"$O/$name.log" 2>&1
  local rc=$?
  cat "$O"/nccl-debug.* >"$O/$name.nccl.log" 2>/dev/null
  local rows wrong slow socket
  rows=$(grep -o 'MNRESULT .*' "$O/$name.log")
  echo "$rows" | sed 's/^/  /'
  wrong=$(echo "$rows" | sed -n 's/.* wrong=\([0-9]*\).*/\1/p' | awk '{s+=$1} END {print s+0}')
  slow=$(echo "$rows" | sed -n 's/.* median_ms=\([0-9.]*\).*/\1/p' | sort -g | tail -1)
  socket=$(grep -c 'NET/Socket' "$O/$name.nccl.log" 2>/dev/null)
  if [ $rc -eq 0 ] && grep -q -- '--- PASS: TestGroupAcrossNodesProcesses' "$O/$name.log" && [ "$wrong" = 0 ]; then
    pass "$name: every collective exact on $(( $1 * $2 )) ranks, 256 MiB all-reduce ${slow:-?} ms (slowest rank's median), NET/Socket lines in NCCL's log: $socket"
  else
    fail "$name (rc $rc, wrong $wrong, see $O/$name.log)"
    grep -h -E 'Error|FAIL|panic|WARN' "$O/$name.log" "$O/$name.nccl.log" 2>/dev/null | head -8
  fi
  [ "${socket:-0}" -gt 0 ] || echo "  note: NCCL's log does not mention NET/Socket; see $O/$name.nccl.log"
}
if [ -x "$B/trainer.test" ]; then
  if [ "$ngpu" -ge 2 ]; then
    two_nodes 2 1 0
    two_nodes 2 2 0
  else
    echo "SKIP nccl-2node (one GPU per node): needs 2 GPUs, found $ngpu"
  fi
  if [ "$ngpu" -ge 1 ]; then
    two_nodes 2 1 1
    two_nodes 2 2 1
  fi
fi
echo "SUMMARY nccl: $fails failure(s); logs in $O"
[ $fails -eq 0 ]
