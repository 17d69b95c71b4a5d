#!/usr/bin/env bash
# h200-priority.sh — issue 10, deliverable 1 ("measure first"), one call on the GPU machine (one
# H200, MIG off, both processes on GPU 0). A high-priority inference job (torchvision ResNet-50,
# batch 1, fp32, one request every 10 ms open loop) and a best-effort training job (ResNet-18,
# batch 32, 224x224, SGD, synthetic data) are measured over the same window in fresh processes:
#   a  infer alone                          b  train alone
#   c  infer + train, no control            d  infer on a high-priority CUDA stream (MPS: not run)
#   e0 both under libmigswap.so + `migctl daemon`, no priority policy (the shim's own cost)
#   e1 the same with the daemon's launch-gating policy "gate"      (issue 10 D2)
#   e2 the same with policy "budget=2" (--budget-n: launches in flight) (issue 10 D2)
#   e3 the same with policy "gate,depth=8" (--depth: the trainer keeps at most 8 launches in
#      flight at any time, so a request finds a short backlog)              (issue 10 D2)
#   f  e3 + slicing of the trainer's kernels, MIGSWAP_SLICE_BLOCKS=64 (issue 10 D3)
# A case whose feature is not in bin/ prints SKIP with the reason; so does one that would not fit
# in the budget (default 265 s; cases run a, b, c, e1, e3, e2, f, e0, d). Each case prints a ROW line;
# the end prints the markdown table, then PASS/FAIL/SKIP per case and TARGET lines (issue 10's
# p99 and throughput targets) — also $OUT/priority/table.md, summary.txt, results.json, per-case
# logs (role JSON and stderr, infer.samples, daemon log, `migctl swap status` snapshots).
# Never changes GPU settings (only read-only nvidia-smi queries); every process has a timeout and
# the ones this script started are killed at the end.
#
# Build (dev machine): make build shim lib      -> bin/migctl, bin/libmigswap.so
# Run (repo root, GPU machine):   OUT=/some/dir scripts/h200-priority.sh [drive options]
#   e.g. DURATION=20 scripts/h200-priority.sh --cases a,b,c
#   drive options: python3 scripts/priority_bench.py drive --help
# Plumbing test without a GPU (torch on the CPU, no torchvision needed; the shim cases on the fake
# libcuda.so): scripts/h200-priority.sh --selftest [--no-torch]
# Environment: OUT (default ./h200-priority-out), BIN (default bin), PYTHON (default python3),
# DURATION (window per case, default 15 s: 1500 requests), BUDGET (default 265 s), TOTAL_TIMEOUT (hard limit of
# the driver, default 290 s: with the version checks the call stays under 5 minutes).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BIN=${BIN:-bin}
R=${OUT:-./h200-priority-out}/priority
mkdir -p "$R"
R=$(cd "$R" && pwd)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

if [[ "${1:-}" == "--selftest" ]]; then
  shift
  # No GPU: the driver with a two-layer torch model on the CPU (cases a-d), then with timed kernels
  # on the fake libcuda.so (bin/fakecuda) under the real shim and daemon (all cases; e1/e2/f where
  # bin/ has the feature, and then the trainer's launches must have been held). PASS/FAIL lines.
  exec timeout -k 10 600 "$PY" scripts/priority_bench.py selftest --out "$R/selftest" --bin "$BIN" "$@"
fi

echo "h200-priority: out=$R bin=$BIN python=$PY $(date -u +%FT%TZ)"
# read-only queries
nvidia-smi --query-gpu=index,name,driver_version,mig.mode.current,memory.used,memory.total,utilization.gpu,compute_mode \
  --format=csv 2>&1 | tee "$R/gpu.txt"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv 2>&1 | tee -a "$R/gpu.txt"
"$PY" - <<'PYV' 2>&1 | tee "$R/versions.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
try:
    import torchvision
    print("torchvision", torchvision.__version__)
except ImportError as e:
    print("torchvision missing:", e)
PYV
for f in migctl libmigswap.so; do
  [[ -e "$BIN/$f" ]] || echo "note: no $BIN/$f (make build shim): the shim cases will SKIP"
done
[[ -x "$BIN/migctl" ]] && "$BIN/migctl" daemon --help > "$R/daemon-help.txt" 2>&1

: > "$R/pids"
timeout -k 5 "${TOTAL_TIMEOUT:-290}" "$PY" scripts/priority_bench.py drive --out "$R" --bin "$BIN" \
  --duration "${DURATION:-15}" --budget "${BUDGET:-265}" "$@"
rc=$?

# Leftovers: only the pids the driver recorded (its roles and daemons, each in its own session),
# and only if that pid still runs one of our command lines.
while read -r pid name; do
  [[ -n "${pid:-}" && -r /proc/$pid/cmdline ]] || continue
  cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline")
  if [[ "$cmd" == *priority_bench.py* || "$cmd" == *"migctl daemon"* ]]; then
    echo "killing leftover $name (pid $pid)"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    sleep 1
    if [[ -r /proc/$pid/cmdline ]] && [[ "$(tr '\0' ' ' < "/proc/$pid/cmdline")" == "$cmd" ]]; then
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    fi
  fi
done < "$R/pids"

if [[ $rc == 124 || $rc == 137 ]]; then
  echo "h200-priority: TIMEOUT after ${TOTAL_TIMEOUT:-290} s (partial results in $R)"
fi
[[ -f "$R/table.md" ]] || echo "h200-priority: no table written (rc $rc)"
echo "h200-priority: rc=$rc, logs in $R"
exit $rc
