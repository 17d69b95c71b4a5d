#!/usr/bin/env bash
# The small all-reduce on the devices (--small-on device; issue 9's 8-KiB row, issue 11's per-call
# cost), one H200, one call, each row beside its CPU-path twin in the same call:
#  1. GPU unit tests of the stream memory operations (bin/cuda.test, bin/comm.test when present);
#  2. bench rows, -c 1, GPU 0: 8 KiB 7 ranks cpu/device interleaved three times (MPS auto), then
#     --mps off (time-sliced contexts: a stream waiting on a flag may hold the GPU; timeout-bounded),
#     a traced device row, 2 ranks and 1 rank, 64 KiB 7 ranks, device rows in half/bfloat16/int32
#     with avg/max (every element checked);
#     2b: 256 MiB 2 and 7 ranks with MIGCTL_STREAM_STORES=0/1 interleaved (non-temporal result stores);
#     2c: 256 MiB with MIGCTL_REDUCE_STAGE=0/1 (device reductions fed by the copy engines): 2 ranks
#     --algo hierarchical and --reduce-on gpu, 7 ranks --reduce-on gpu and split:0.25, and defaults;
#  3. gloo at 8 KiB, 7 ranks (the peer);
#  4. PyTorch with MIGCTL_TUNING=smallon=device: gpu_checks.py (every op; a kernel-written input
#     must not be read early), then the per-call cost (overhead_check.py, 7 ranks) with smallon=cpu
#     and smallon=device (device: small CUDA all-reduces finish in stream order, ABI 6).
# Build here first: make build lib; go test -c -ldflags='-s -w' -o bin/cuda.test ./internal/cuda;
# go test -c -ldflags='-s -w' -o bin/comm.test ./comm; cp ../shared/bench/gloo_allreduce.py bin/.
# What travels is capped at 64 MiB: migctl (~21 MB), libmigctl.so (~14), comm.test (~13), cuda.test
# (~5) and the gloo script make ~53 MB: remove everything else from bin/ before the call (carry
# ["bin"]; `make build` rebuilds the rest afterwards).
# Output: $OUT/smalldev/summary.txt, logs.tgz. About 7 minutes (one call; trim 2c if short of time).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init smalldev

say "== 1. GPU unit tests"
for t in "cuda.test TestDriverStreamMemOps" "comm.test TestCUDADeviceGPUStreamWords|TestCUDADeviceGPUStagedReduce"; do
  set -- $t
  if [ -x "bin/$1" ]; then
    timeout 60 "bin/$1" -test.run "$2" -test.v >"$W/$1.out" 2>&1
    say "$1 $2 rc=$? $(grep -E -- '^(--- |ok|FAIL)|released' "$W/$1.out" | tr '\n' ' ')"
  else
    say "$1: not built, skipped"
  fi
done

say "== 2. bench rows"
for i in 1 2 3; do
  row "r7-8K-cpu-$i" 7 8KiB 2000 200 --small-on cpu
  row "r7-8K-dev-$i" 7 8KiB 2000 200 --small-on device
done
say "r7-8K-dev-1 smallOn: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("smallOn", "cpu"))' "$W/r7-8K-dev-1.json" 2>/dev/null)"
row r7-8K-cpu-mpsoff 7 8KiB 1000 100 --small-on cpu --mps off
row r7-8K-dev-mpsoff 7 8KiB 1000 100 --small-on device --mps off
MIGCTL_TRACE=1 row r7-8K-dev-trace 7 8KiB 1000 100 --small-on device
say "trace: $(grep -m1 -A12 'hoststaged-small 8192 B' "$W/r7-8K-dev-trace.err" | tr -s ' ' | head -c 1500)"
for np in 2 1; do
  row "r$np-8K-cpu" "$np" 8KiB 2000 200 --small-on cpu
  row "r$np-8K-dev" "$np" 8KiB 2000 200 --small-on device
done
row r7-64K-cpu 7 64KiB 1000 100 --small-on cpu
row r7-64K-dev 7 64KiB 1000 100 --small-on device
for dt in half bfloat16 int32; do
  for op in avg max; do row "r7-8K-dev-$dt-$op" 7 8KiB 200 20 --small-on device --dtype "$dt" --op "$op"; done
done

say "== 2b. 256 MiB with the reductions' results stored past the cache (MIGCTL_STREAM_STORES)"
for i in 1 2; do
  for s in 0 1; do MIGCTL_STREAM_STORES=$s row "r2-256M-nt$s-$i" 2 256MiB 10 3; done
  for s in 0 1; do MIGCTL_STREAM_STORES=$s row "r7-256M-nt$s-$i" 7 256MiB 10 3; done
done

say "== 2c. 256 MiB, device reductions fed by the copy engines (MIGCTL_REDUCE_STAGE=1) vs read over the link"
# 2 ranks, one group: no CPU step, host memory 4S instead of the host-staged (3n+1)S; the link binds.
for st in 0 1; do
  MIGCTL_REDUCE_STAGE=$st row "r2-256M-hier-stage$st" 2 256MiB 10 3 --algo hierarchical
  MIGCTL_REDUCE_STAGE=$st row "r2-256M-gpu-stage$st" 2 256MiB 10 3 --reduce-on gpu
  MIGCTL_REDUCE_STAGE=$st row "r7-256M-gpu-stage$st" 7 256MiB 10 3 --reduce-on gpu
  MIGCTL_REDUCE_STAGE=$st row "r7-256M-split-stage$st" 7 256MiB 10 3 --reduce-on split:0.25
done
row r2-256M-default 2 256MiB 10 3
row r7-256M-default 7 256MiB 10 3

say "== 3. gloo"
GLOO=bin/gloo_allreduce.py
if [ -f "$GLOO" ]; then
  timeout 120 python3 "$GLOO" --np 7 --sizes 8K --iters 200 >"$W/gloo.txt" 2>"$W/gloo.err"
  say "gloo rc=$? $(grep -h 'np=7' "$W/gloo.txt" | head -3 | tr '\n' ' ')"
else
  say "gloo: bin/gloo_allreduce.py missing, skipped"
fi

say "== 4. PyTorch: correctness (gpu_checks.py, stream order included) and per-call cost, 7 ranks"
MIGCTL_TUNING=smallon=device timeout 300 $M run --gpus 0 --np 7 -q --timeout 120s -- \
  python3 python/tests/gpu_checks.py >"$W/gpu-checks-dev.out" 2>&1
say "gpu_checks smallon=device rc=$?"; grep -h '"failures"' "$W/gpu-checks-dev.out" | head -1 | cut -c 1-300 >>"$S"
for on in cpu device cpu device; do ovh "smallon=$on" MIGCTL_TUNING=smallon=$on; done
