#!/usr/bin/env bash
# gpu-smoke.sh — run the CUDA binding and CUDA device tests on a GPU machine,
# logs and a summary in OUTDIR.
#
#   go test -c -trimpath -ldflags='-s -w' -o bin/cuda.test ./internal/cuda
#   go test -c -trimpath -ldflags='-s -w' -o bin/comm.test ./comm
#   scripts/gpu-smoke.sh [OUTDIR]            # default bin/gpu-smoke
#   GEN_PTX=1 scripts/gpu-smoke.sh OUTDIR    # first regenerate the PTX with nvcc
#                                            # and test that instead of the embedded one
#   BENCH=1 scripts/gpu-smoke.sh OUTDIR      # also bin/migctl bench allreduce --backend gpu
#                                            # --transport shm for 2 and 7 ranks
#
# MIGCTL_PTX=path makes the tests load that PTX instead of the embedded one.
# Never changes MIG mode or any GPU setting.
set -u
cd "$(dirname "$0")/.."
out=${1:-${OUT:-bin/gpu-smoke}}
mkdir -p "$out"
{
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,mig.mode.current,pci.bus_id --format=csv
} >"$out/nvidia-smi.txt" 2>&1

if [[ ${GEN_PTX:-0} == 1 ]]; then
  if REQUIRE_NVCC=1 bash scripts/gen-ptx.sh >"$out/gen-ptx.log" 2>&1; then
    cp allreduce/kernels/*.ptx "$out/"
    export MIGCTL_PTX=$PWD/allreduce/kernels/reduce.ptx
  elif [[ -f bin/reduce-fallback.ptx ]]; then
    echo "gen-ptx failed; testing bin/reduce-fallback.ptx" >>"$out/gen-ptx.log"
    export MIGCTL_PTX=$PWD/bin/reduce-fallback.ptx
  fi
fi

rc=0
run() { # name binary args...
  local name=$1 start=$SECONDS st=0
  shift
  "$@" >"$out/$name.log" 2>&1 || st=$?
  [[ $st == 0 ]] || rc=1
  echo "== $name: exit $st in $((SECONDS - start))s" >>"$out/summary.txt"
}
[[ -x bin/cuda.test ]] && run cuda-test bin/cuda.test -test.v -test.count=1 -test.timeout=180s -test.run=GPU
[[ -x bin/comm.test ]] && run comm-test bin/comm.test -test.v -test.count=1 -test.timeout=420s -test.run=CUDADeviceGPU
if [[ ${BENCH:-0} == 1 && -x bin/migctl ]]; then
  bench() { # name args...
    local name=$1
    shift
    run "$name" timeout 150 bin/migctl bench allreduce --backend gpu --transport shm "$@"
    { echo "== $name: migctl bench allreduce --backend gpu --transport shm $*"; grep -v '^bench:' "$out/$name.log" | tail -12; } >>"$out/summary.txt"
  }
  bench bench-np2 --np 2 -b 1MiB -e 256MiB -f 4 -c 1 -n 10 -w 3
  bench bench-np7 --np 7 -b 8KiB -e 256MiB -f 32 -c 1 -n 10 -w 3
  bench bench-np7-ring --np 7 --algo ring -b 256MiB -e 256MiB -c 1 -n 5 -w 2
fi
for f in "$out"/cuda-test.log "$out"/comm-test.log; do
  [[ -f $f ]] || continue
  {
    echo "== $(basename "$f")"
    grep -E '^(--- |ok|FAIL|PASS|panic)|GB/s|each|topology|driver [0-9]|opened|maps to|own IPC' "$f" | grep -v '^    --- PASS' | head -80
    echo "subtests passed: $(grep -c '^    --- PASS' "$f"), failed: $(grep -c -- '--- FAIL' "$f")"
  } >>"$out/summary.txt"
done
cat "$out/summary.txt"
exit $rc
