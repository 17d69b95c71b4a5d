#!/usr/bin/env bash
# The decisive A/B of small copies in by a kernel (MIGCTL_H2D=kernel) vs 2D rows (default), one H200,
# after h2d-kernel.sh's mixed first look: 8 KiB 7 ranks six interleaved pairs, traced once each way
# (copy-in completion times side by side), 4 KiB 7 ranks and 8 KiB 2 ranks three pairs each.
# Build as h2d-kernel.sh (migctl only is needed). Output: $OUT/h2dab/summary.txt, logs.tgz. ~3 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init h2dab
for i in 1 2 3 4 5 6; do
  for h in 2drows kernel; do MIGCTL_H2D=$h row "r7-8K-$h-$i" 7 8KiB 3000 300; done
done
for h in 2drows kernel; do
  MIGCTL_H2D=$h MIGCTL_TRACE=1 row "r7-8K-$h-trace" 7 8KiB 1000 100
  say "trace $h: $(grep -m1 -A4 'hoststaged-small 8192 B' "$W/r7-8K-$h-trace.err" | grep -E 'copyin|hoststaged-small' | tr -s ' ' | head -c 600)"
done
for i in 1 2 3; do
  for h in 2drows kernel; do
    MIGCTL_H2D=$h row "r7-4K-$h-$i" 7 4KiB 2000 200
    MIGCTL_H2D=$h row "r2-8K-$h-$i" 2 8KiB 2000 200
  done
done
