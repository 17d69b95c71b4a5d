#!/usr/bin/env bash
# Issue 9's 2-rank row (256 MiB, 2 ranks on GPU 0): host-staged (default) against the shm ring, whose
# device reductions either read the peer's block over the link from the kernel (default) or have the
# copy engines stage it in device memory first (MIGCTL_REDUCE_STAGE=1). For 2 ranks the ring moves
# what host-staged moves over the link (S out and S in per rank) but half of its host-memory traffic
# (4S against 7S, no CPU reads), and host memory is what binds host-staged there. Interleaved, every
# element checked; 3 and 7 ranks for the cost model; the staged ring's correctness at odd sizes.
# Build: make build; carry ["bin"]. Output: $OUT/ring2/{summary.txt,logs.tgz}. ~3 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init ring2
$M bench limits >>"$S" 2>&1
for i in 1 2; do
  row "r2-hoststaged-$i" 2 256MiB 10 3
  row "r2-ring-$i" 2 256MiB 10 3 --algo ring
  MIGCTL_REDUCE_STAGE=1 row "r2-ring-stage-$i" 2 256MiB 10 3 --algo ring
done
MIGCTL_REDUCE_STAGE=1 row r2-ring-stage-c4M 2 256MiB 10 3 --algo ring --chunk 4MiB
MIGCTL_REDUCE_STAGE=1 row r2-ring-stage-c16M 2 256MiB 10 3 --algo ring --chunk 16MiB
MIGCTL_REDUCE_STAGE=1 row r2-ring-stage-s16 2 256MiB 10 3 --algo ring --slots 16
MIGCTL_REDUCE_STAGE=1 row r2-ring-stage-c4M-s16 2 256MiB 10 3 --algo ring --chunk 4MiB --slots 16
row r3-hoststaged 3 256MiB 10 3
MIGCTL_REDUCE_STAGE=1 row r3-ring-stage 3 256MiB 10 3 --algo ring
row r7-hoststaged 7 256MiB 5 2
MIGCTL_REDUCE_STAGE=1 row r7-ring-stage 7 256MiB 5 2 --algo ring
for dt in float bf16; do
  MIGCTL_REDUCE_STAGE=1 timeout 120 $M bench allreduce --backend gpu --transport shm --gpu 0 --np 2 --algo ring \
    -b 8 -e 9MiB -f 7 -n 3 -w 1 -c 1 --dtype $dt --op sum >"$W/odd-$dt.txt" 2>&1
  say "odd sizes 2 ranks ring staged $dt rc=$? wrong(sum of column)=$(awk 'NR>1 && $8 ~ /^[0-9]+$/ {s+=$8} END {print s+0}' "$W/odd-$dt.txt") rows=$(grep -c '^[0-9]' "$W/odd-$dt.txt")"
done
MIGCTL_TRACE=1 MIGCTL_REDUCE_STAGE=1 row r2-ring-stage-trace 2 256MiB 5 2 --algo ring
