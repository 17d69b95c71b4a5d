#!/usr/bin/env bash
# swap-h200.sh — the H200 measurement of the memory-swap shim (issue 4).
#
# Runs, in one go and on one GPU: the per-launch cost of the shim (C microbenchmark, no-op
# kernel, with and without LD_PRELOAD), ResNet-18 training without the shim, with the shim and
# no swaps, and with the shim swapped out and in after every step (eager, and one CUDA graph
# per step with twice the steps; losses must equal the runs without the shim), the training
# overhead of the loaded shim (alternated bare/shim runs, medians), the swap-out/in
# throughput and request->free latency of a 16 GiB victim, and the driver's checkpoint API
# (cuCheckpointProcessLock/Checkpoint/Restore/Unlock) on the same size as the peer. It prints a
# summary table and leaves summary.txt, summary.json and logs.tgz in $OUT.
#
# The daemon side is scripts/swap_train.py's driver, which speaks shim/PROTOCOL.md itself so
# that latency is measured at the socket. It never touches MIG mode, GPU settings or resets.
#
# Usage (repository root, on the GPU machine; build first with `make shim BIN=bin/swap-h200`
# or `make -C shim BIN=$PWD/bin/swap-h200` on any x86-64 machine):
#   scripts/swap-h200.sh            # the full measurement (~4 minutes)
#   scripts/swap-h200.sh --quick    # a short check: 40 steps, 2 GiB victim, 3 cycles
#   scripts/swap-h200.sh --overhead-pairs 0 --prepin   # options: see swap_train.py drive --help
# Environment: OUT (output folder, default a temporary one), MIGSWAP_BIN (default bin/swap-h200,
# else bin), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d /tmp/swap-h200-out.XXXXXX)}
BIN=${MIGSWAP_BIN:-}
if [[ -z "$BIN" ]]; then
  if [[ -f bin/swap-h200/libmigswap.so ]]; then BIN=bin/swap-h200; else BIN=bin; fi
fi
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
for f in libmigswap.so migswap_testprog; do
  [[ -f "$BIN/$f" ]] || { echo "missing $BIN/$f: build with make -C shim BIN=\$PWD/$BIN" >&2; exit 2; }
done
echo "swap-h200: bin=$BIN out=$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,mig.mode.current --format=csv || true
"$PY" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.version.cuda)'
exec "$PY" scripts/swap_train.py drive --bin "$BIN" --out "$OUT" "$@"
