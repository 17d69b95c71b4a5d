#!/usr/bin/env bash
# Third look at the direct migctl_run (per-call probe vs the 8 KiB bench row, 7 ranks, x2, and the
# dispatcher once), then DDP under `migctl run --swap` with this library
# (scripts/h200-train.d/pytorch-swap.sh: hand swap-out past the deadline, and preemption by a
# priority-10 job; both must end bit-identical to the unpreempted run).
# Build: make build shim lib; carry ["bin"]. Output: $OUT/dswap/summary.txt, $OUT/pytorch-swap. ~5 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init dswap
for i in 1 2; do
  row "r7-8K-$i" 7 8KiB 3000 300
  ovh "direct-$i"
done
ovh ring MIGCTL_LIB_DIRECT_MAX=0
row r7-8K-3 7 8KiB 3000 300
timeout 300 bash scripts/h200-train.d/pytorch-swap.sh 2>&1 | tail -5 | while read -r l; do say "swap: $l"; done
