#!/usr/bin/env bash
# h200-collectives.sh — one call on the GPU machine for issues 2 and 3: the read-only
# simulator-vs-H200 conformance test, the collectives benchmark beside gloo (scripts/bench-h200.sh),
# where two GPUs are present, torch's NCCL all-reduce across them as the IPC ring's peer, and
# scripts/gpu-collectives-check.sh (every collective checked element by element on the GPU).
# Everything it needs is built here first:
#   make build && go test -c -trimpath -ldflags='-s -w' -o bin/migsim.test ./mig/migsim \
#     && cp ../shared/bench/gloo_allreduce.py bin/
# Results go to $OUT as at most 8 files (the device tool brings back no more): conformance.txt,
# bench-table.md, nccl2.txt, gpu-check.txt, logs.tgz (every log), summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-./h200-out}
mkdir -p "$R"
W=$(mktemp -d /tmp/h200-collectives.XXXX)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s)
echo "== conformance (read-only NVML)"
timeout 60 bin/migsim.test -test.run ConformanceH200 -test.v > "$R/conformance.txt" 2>&1
echo "conformance rc=$?" | tee "$W/rc.txt"
tail -3 "$R/conformance.txt"

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${ngpu:-0}" -ge 2 ]; then
  echo "== NCCL peer, 2 GPUs"
  timeout 90 python3 scripts/peer_allreduce_multigpu.py --backend nccl --np 2 --sizes 8K,1M,256M --iters 20 \
    > "$R/nccl2.txt" 2> "$W/nccl2.err"
  echo "nccl rc=$?" | tee -a "$W/rc.txt"
  cat "$R/nccl2.txt"
fi

echo "== collectives bench beside gloo"
NCCL2="$R/nccl2.txt" OUT="$W/bench" timeout 430 scripts/bench-h200.sh > "$W/bench.log" 2>&1
echo "bench rc=$?" | tee -a "$W/rc.txt"
cp "$W/bench/table.md" "$R/bench-table.md" 2>/dev/null
cat "$R/bench-table.md" 2>/dev/null || tail -30 "$W/bench.log"
echo "== every collective, dtype and op checked on the GPU"
OUT="$W/check" timeout 240 scripts/gpu-collectives-check.sh > "$R/gpu-check.txt" 2>&1
echo "gpu-check rc=$?" | tee -a "$W/rc.txt"
tail -1 "$R/gpu-check.txt"
tar czf "$R/logs.tgz" -C "$W" . 2>/dev/null
{ cat "$W/rc.txt"; echo "wall $(( $(date +%s) - t0 ))s"; } | tee "$R/summary.txt"
