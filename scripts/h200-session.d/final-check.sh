#!/usr/bin/env bash
# The session's final build on one H200: stream-order checks with direct runs at 7 ranks
# (python/tests/gpu_checks.py), the per-call probe and the 8 KiB bench row beside it.
# Build: make build lib; carry ["bin"]. Output: $OUT/final/summary.txt. ~2 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init final
timeout 100 $M run --gpus 0 --np 7 -q --timeout 60s -- python3 python/tests/gpu_checks.py >"$W/gpu_checks.out" 2>&1
say "gpu_checks np=7 rc=$? $(grep -c '"failures": \[\]' "$W/gpu_checks.out") ranks without failures"
row r7-8K 7 8KiB 3000 300
ovh direct
