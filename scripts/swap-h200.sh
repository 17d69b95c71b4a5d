#!/usr/bin/env bash
# swap-h200.sh — the H200 measurement of the memory-swap shim (issue 4), in one go on one GPU.
#
# Starts `migctl daemon` (sockets in a private temp folder) and drives every swap through
# `migctl swap out|in --job`; runs the per-launch cost (C microbenchmark, with and without
# LD_PRELOAD), the training overhead of the loaded shim (alternated bare/shim ResNet-18 runs,
# median step times), a need-driven preemption (a priority-10 job under the shim asks for more
# memory than is free; the daemon swaps the priority-0 trainer out and back in), ResNet-18 eager
# and CUDA-graph training swapped out and in >= 100 times each (losses must equal the runs
# without swaps), the first swap of a fresh process with and without MIGSWAP_PREPIN, the
# swap-out/in throughput and request->free latency of a 16 GiB victim, and the driver's
# checkpoint API on the same size. Prints a markdown summary (peer, ours, target, pass/fail)
# and leaves summary.md, summary.json and logs.tgz in $OUT. Never touches MIG mode, GPU
# settings or resets. Phases that would not fit in --budget (default 370 s) are skipped.
#
# Build here (any x86-64 machine with Go and gcc; nothing on the GPU machine is compiled):
#   scripts/swap-h200.sh --build         # -> bin/swap-h200/{migctl,libmigswap.so,migswap_testprog,...}
#   scripts/swap-h200.sh --selftest      # the whole flow against the fake libcuda.so (no GPU)
# Run (repository root, on the GPU machine):
#   OUT=$OUT scripts/swap-h200.sh                 # the full measurement (~5 minutes)
#   OUT=$OUT scripts/swap-h200.sh --quick         # a short check
#   scripts/swap-h200.sh --ctl python             # the old protocol driver instead of the daemon
#   other options: python3 scripts/swap_train.py drive --help
# Environment: OUT (output folder, default a temporary one), MIGSWAP_BIN (default bin/swap-h200),
# PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MIGSWAP_BIN:-bin/swap-h200}
PY=${PYTHON:-python3}
if [[ "${1:-}" == "--build" ]]; then
  make -C shim BIN="$PWD/$BIN"
  go build -trimpath -ldflags='-s -w' -o "$BIN/migctl" ./cmd/migctl
  ls -la "$BIN"
  exit 0
fi
if [[ "${1:-}" == "--selftest" ]]; then
  shift
  exec "$PY" scripts/swap_train.py selftest --bin "$BIN" "$@"
fi
OUT=${OUT:-$(mktemp -d /tmp/swap-h200-out.XXXXXX)}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
for f in libmigswap.so migswap_testprog migctl; do
  [[ -x "$BIN/$f" || -f "$BIN/$f" ]] || { echo "missing $BIN/$f: build with scripts/swap-h200.sh --build" >&2; exit 2; }
done
echo "swap-h200: bin=$BIN out=$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,mig.mode.current --format=csv || true
"$PY" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.version.cuda)'
exec "$PY" scripts/swap_train.py drive --bin "$BIN" --out "$OUT" "$@"
