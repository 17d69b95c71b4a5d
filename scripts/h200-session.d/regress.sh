#!/usr/bin/env bash
# GPU regression at this build (one GPU): the Go tests that need a real GPU (internal/cuda, comm,
# internal/nccl), then the PyTorch backend's checks on CUDA tensors with ranks on GPU 0 (the MIG path):
# every op and dtype (7 ranks), stream order (7), FSDP vs DDP (7), groups of some ranks (4),
# point-to-point (4), the DDP comm hook (2), CUDA-graph capture (2), mismatched calls (3), a killed rank
# (3, DDP and Futures). Build: make build lib; go test -c -trimpath -ldflags='-s -w' -o bin/X.test for
# ./internal/cuda ./comm ./internal/nccl; carry ["bin/migctl", "bin/libmigctl.so", "bin/cuda.test",
# "bin/comm.test", "bin/nccl.test"]. Output: $OUT/regress/{summary.txt,logs.tgz}. ~7 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init regress
gotest() { # tag binary pattern
  (cd "$(dirname "$2")" && timeout 240 "./$(basename "$2")" -test.run "$3" -test.v -test.timeout 230s) >"$W/$1.out" 2>&1
  say "$1 rc=$? pass=$(grep -c '^--- PASS' "$W/$1.out") fail=$(grep -c '^--- FAIL' "$W/$1.out") skip=$(grep -c '^--- SKIP' "$W/$1.out") $(grep '^--- FAIL' "$W/$1.out" | head -3 | tr '\n' ' ')"
}
if [ -z "${NOGO:-}" ]; then # NOGO=1: the PyTorch checks alone (carry bin/migctl and bin/libmigctl.so)
  gotest go-cuda bin/cuda.test 'GPU|Driver'
  gotest go-comm bin/comm.test 'GPU'
  gotest go-nccl bin/nccl.test 'Real'
fi
check ops-cuda-7 7 180 python/tests/ops_check.py --device cuda --sizes 0,7,65539
check gpu-checks-7 7 80 python/tests/gpu_checks.py
say "  broadcast root's call ms (sync, async, pair, third): $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/gpu-checks-7.out" | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline()).get("broadcast_root_call_ms"))' 2>/dev/null)"
check capture-2 2 30 python/tests/capture_check.py
timeout 150 $M run --gpus 0 --np 7 -q --timeout 120s -- python3 python/tests/fsdp_check.py >"$W/fsdp.out" 2>&1
say "fsdp-7 rc=$? $(grep -h '^\[0\]: {' "$W/fsdp.out" | head -1 | cut -c1-300)"
timeout 120 $M run --gpus 0 --np 4 -q --timeout 90s -- python3 python/tests/subgroup_check.py --device cuda >"$W/subgroup.out" 2>&1
say "subgroup-cuda-4 rc=$? $(grep -c '"failures": \[\]' "$W/subgroup.out") clean of 4"
timeout 120 $M run --gpus 0 --np 4 -q --timeout 90s -- python3 python/tests/p2p_check.py --device cuda >"$W/p2p.out" 2>&1
say "p2p-cuda-4 rc=$? $(grep -c '"failures": \[\]' "$W/p2p.out") clean of 4"
timeout 120 $M run --gpus 0 --np 2 -q --timeout 90s -- python3 python/tests/ddp_check.py >"$W/ddp-hook.out" 2>&1
say "ddp-hook-2 rc=$? $(grep -h '^\[0\]: {' "$W/ddp-hook.out" | head -1 | cut -c1-200)"
for c in count coll ddp; do
  timeout 90 $M run --gpus 0 --np 3 -q --timeout 60s -- python3 python/tests/mismatch_check.py --device cuda --case $c \
    >"$W/mismatch-$c.out" 2>&1
  say "mismatch cuda $c rc=$? raised: $(grep -c '"raised": true' "$W/mismatch-$c.out") of 3, clean: $(grep -c '"failures": \[\]' "$W/mismatch-$c.out")"
done
for k in ddp future; do
  MIGCTL_TIMEOUT=10s timeout 100 $M run --gpus 0 --np 3 --grace 60s -- \
    python3 python/tests/kill_check.py --device cuda --$k --ignore-term >"$W/kill-$k.out" 2>&1
  say "kill_check cuda --$k np=3 rc=$? survivors raised: $(grep -c '"raised": true' "$W/kill-$k.out") of 2; segfaults: $(grep -ci 'segmentation\|SIGSEGV' "$W/kill-$k.out")"
done
# DDP takes the queued broadcasts (nothing in flight at the forward pass): level with bcast=cpu, ranks identical
ddp resnet32-queued resnet 32 migctl
MIGCTL_TUNING=bcast=cpu ddp resnet32-bcastcpu resnet 32 migctl
