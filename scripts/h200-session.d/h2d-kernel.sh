#!/usr/bin/env bash
# Small copies in by a kernel (MIGCTL_H2D=kernel, comm.H2DKernel) vs the copy engines' 2D rows (the
# default), issue 9's 8-KiB row and issue 11's per-call cost, one H200, every row beside its twin:
#  1. GPU unit test of the copy kernel (bin/comm.test);
#  2. 8 KiB 7 ranks, 2drows/kernel interleaved three times; traced kernel row; 2 ranks; 16 KiB 7 ranks;
#     kernel rows in half/int32 avg (every element checked);
#  3. 256 MiB 2 ranks, --reduce-workers 8 vs the default (6), twice;
#  4. PyTorch, 7 ranks: gpu_checks.py with kernel copies, the per-call cost with 2drows and kernel;
#  5. gloo 8 KiB 7 ranks (the peer).
# Build here: make build lib; go test -c -ldflags='-s -w' -o bin/comm.test ./comm;
# cp ../shared/bench/gloo_allreduce.py bin/; nothing else in bin/ (~48 MB); carry ["bin"].
# Output: $OUT/h2dk/summary.txt, logs.tgz. About 5 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init h2dk

say "== 1. GPU unit test"
timeout 60 bin/comm.test -test.run 'TestCUDADeviceGPUSmallH2DKernel' -test.v >"$W/comm.test.out" 2>&1
say "comm.test rc=$? $(grep -E -- '^(--- |ok|FAIL|PASS)' "$W/comm.test.out" | tr '\n' ' ')"

say "== 2. 8 KiB"
for i in 1 2 3; do
  MIGCTL_H2D=2drows row "r7-8K-rows-$i" 7 8KiB 2000 200
  MIGCTL_H2D=kernel row "r7-8K-kern-$i" 7 8KiB 2000 200
done
MIGCTL_H2D=kernel MIGCTL_TRACE=1 row r7-8K-kern-trace 7 8KiB 1000 100
say "trace: $(grep -m1 -A5 'hoststaged-small 8192 B' "$W/r7-8K-kern-trace.err" | tr -s ' ' | head -c 1400)"
for h in 2drows kernel; do
  MIGCTL_H2D=$h row "r2-8K-$h" 2 8KiB 2000 200
  MIGCTL_H2D=$h row "r7-16K-$h" 7 16KiB 1000 100
done
for dt in half int32; do MIGCTL_H2D=kernel row "r7-8K-kern-$dt-avg" 7 8KiB 200 20 --dtype "$dt" --op avg; done

say "== 3. 256 MiB, 2 ranks, reduce workers"
for i in 1 2; do
  row "r2-256M-w6-$i" 2 256MiB 10 3
  row "r2-256M-w8-$i" 2 256MiB 10 3 --reduce-workers 8
done

say "== 4. PyTorch, 7 ranks"
MIGCTL_H2D=kernel timeout 200 $M run --gpus 0 --np 7 -q --timeout 120s -- \
  python3 python/tests/gpu_checks.py >"$W/gpu-checks-kern.out" 2>&1
say "gpu_checks kernel rc=$?"; grep -h '"failures"' "$W/gpu-checks-kern.out" | head -1 | cut -c 1-300 >>"$S"
for h in 2drows kernel 2drows kernel; do ovh "h2d=$h" MIGCTL_H2D=$h; done

say "== 5. gloo"
timeout 120 python3 bin/gloo_allreduce.py --np 7 --sizes 8K --iters 200 >"$W/gloo.txt" 2>"$W/gloo.err"
say "gloo rc=$? $(grep -h 'np=7' "$W/gloo.txt" | head -3 | tr '\n' ' ')"
