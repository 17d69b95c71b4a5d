#!/usr/bin/env bash
# Where the direct migctl_run stops paying: 7 ranks on GPU 0 under MPS, CUDA tensors, the per-call
# probe (python/tests/overhead_check.py, ELEMS float32) direct vs through the dispatcher
# (MIGCTL_LIB_DIRECT_MAX=0) at 64 KiB, 256 KiB and 1 MiB, beside the bench row of each size.
# Build: make build lib; carry ["bin"]. Output: $OUT/dsizes/summary.txt. ~3 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init dsizes
for kib in 64 256 1024; do
  row "r7-${kib}K" 7 "${kib}KiB" 1000 100
  n=$((4096 / (kib / 64 + 3)))
  ovh "direct-${kib}K" ELEMS=$((kib * 256)) N=$n ROUNDS=3
  ovh "ring-${kib}K" ELEMS=$((kib * 256)) N=$n ROUNDS=3 MIGCTL_LIB_DIRECT_MAX=0
done
