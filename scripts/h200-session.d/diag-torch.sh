#!/usr/bin/env bash
# Diagnosis of the torch backend on one H200 (issue 11), for the lead's GPU call:
#  1. the op suite on CUDA tensors, 7 ranks, size 65539 (did not finish last session): every
#     check timed (OPS_TRACE), stacks dumped if it stalls (OPS_DUMP_AFTER);
#  2. where an all-reduce's time goes inside DDP (ResNet-18 batch 8, MIGCTL_TRACE=1) vs the same
#     sizes in `migctl bench` with an idle GPU and with 7 busy processes on it.
# Needs bin/migctl, bin/libmigctl.so (make build lib). Logs under $OUT/diag-torch/.
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp}/diag-torch; mkdir -p "$O"
export MIGCTL_LIB=$PWD/bin/libmigctl.so
M=bin/migctl
echo "== 1. op suite, CUDA, 7 ranks, n=65539"
OPS_TRACE=1 OPS_DUMP_AFTER=100 timeout 130 $M run --gpus 0 --np 7 --timeout 30s --log-dir "$O/ops7" -- \
  python3 python/tests/ops_check.py --device cuda --sizes 65539 --large 0 >"$O/ops7.out" 2>&1
echo "ops7 rc=$?"; tail -5 "$O/ops7.out"
grep -h "\[ops\]" "$O"/ops7/* "$O/ops7.out" 2>/dev/null | sort -k2 -n -r | head -8
grep -h -A12 "Thread\|Current thread" "$O"/ops7/* "$O/ops7.out" 2>/dev/null | head -60
echo "== 2a. DDP ResNet-18 b8, 7 ranks, migctl, MIGCTL_TRACE=1"
MIGCTL_TRACE=1 timeout 150 $M run --gpus 0 --np 7 -q -- python3 examples/pytorch/ddp_resnet.py \
  --backend migctl --batch 8 --steps 40 >"$O/ddp-trace.out" 2>&1
echo "rc=$?"; grep -v "^\[[1-6]\]" "$O/ddp-trace.out" | tail -40
echo "== 2b. bench, idle GPU: 7 ranks, 1/24/47/110 MB"
for s in 1MiB 24MiB 47MiB 110MiB; do
  timeout 60 $M bench allreduce --np 7 --backend gpu --transport shm -b $s -e $s -n 10 -w 3 -c 1 2>&1 | tail -2
done | tee "$O/bench-idle.out"
echo "== 2c. bench with 7 busy processes on GPU 0 (matmul loops)"
cat >"$O/busy.py" <<'PY'
import time, torch
a = torch.randn(4096, 4096, device="cuda"); b = torch.randn(4096, 4096, device="cuda")
end = time.time() + 40
while time.time() < end:
    for _ in range(4): c = a @ b
    torch.cuda.synchronize()
PY
pids=(); for i in 1 2 3 4 5 6 7; do python3 "$O/busy.py" & pids+=($!); done
sleep 8
for s in 1MiB 24MiB 47MiB; do
  timeout 60 $M bench allreduce --np 7 --backend gpu --transport shm -b $s -e $s -n 10 -w 3 -c 1 2>&1 | tail -2
done | tee "$O/bench-busy.out"
MIGCTL_TRACE=1 timeout 60 $M bench allreduce --np 7 --backend gpu --transport shm -b 24MiB -e 24MiB -n 10 -w 3 > "$O/bench-busy-trace.out" 2>&1
tail -30 "$O/bench-busy-trace.out"
kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null
echo "== done"
