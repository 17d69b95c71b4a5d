#!/usr/bin/env bash
# Probes on a real H200 (2026-12-02, fifth part, call 3): a collective inside a CUDA graph capture
# (capture_check.py: must raise on every rank, the group then still works); the PyTorch per-call probe
# (overhead_check.py, 7 ranks, CUDA tensors) beside `migctl bench` at 8 KiB for issue 11's <= 20 us.
# PROBES=capture: the capture check alone (call 4, after the error was made to say why).
# Build: make build lib; carry ["bin"]. Output: $OUT/probes/{summary.txt,logs.tgz}.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init probes
timeout 90 $M run --gpus 0 --np 2 -q --timeout 30s -- python3 python/tests/capture_check.py >"$W/capture.out" 2>&1
say "capture_check rc=$? $(grep -o "{.*}" "$W/capture.out" | cut -c1-700 | paste -sd"|")"
[ "${PROBES:-all}" = capture ] && exit 0  # call 4: the capture check again, with the clear error
row r7-8K-1 7 8KiB 3000 300
ovh direct
row r7-8K-2 7 8KiB 3000 300
ovh direct
