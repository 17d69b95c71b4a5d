#!/usr/bin/env bash
# Arena geometry where shared memory is short or per link (one H200 or H100, torch 2.x, ranks on GPU 0):
# point-to-point links at their new default (4 slots of 2 MiB) against the old one (8 of 8 MiB, through
# MIGCTL_TUNING), interleaved twice, gloo beside; and which shrink of a host-staged all-reduce's arena costs
# least when it must fit 32 MiB (half a container's 64-MiB /dev/shm): fewer slots or smaller chunks, 2 and
# 7 ranks, 256 MiB, against the default geometry and gloo in the same run.
# Build: make build lib; cp ../shared/bench/gloo_allreduce.py bin/; carry ["bin"]. Output: $OUT/geometry/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init geometry
for i in 1 2; do
  pp "pp-link2Mx4-$i" migctl X=1
  pp "pp-old8Mx8-$i" migctl MIGCTL_TUNING=chunk=8MiB,slots=8
done
pp pp-gloo gloo X=1
for i in 1 2; do
  row "r2-default-$i" 2 256MiB 5 2
  row "r2-1Mx8-$i" 2 256MiB 5 2 --chunk 1MiB --slots 8
  row "r2-2Mx4-$i" 2 256MiB 5 2 --chunk 2MiB --slots 4
  row "r2-4Mx2-$i" 2 256MiB 5 2 --chunk 4MiB --slots 2
  row "r7-default-$i" 7 256MiB 5 2
  row "r7-512Kx8-$i" 7 256MiB 5 2 --chunk 512KiB --slots 8
  row "r7-1Mx4-$i" 7 256MiB 5 2 --chunk 1MiB --slots 4
  row "r7-2Mx2-$i" 7 256MiB 5 2 --chunk 2MiB --slots 2
done
timeout 200 python3 bin/gloo_allreduce.py --np 7 --sizes 256M --iters 3 >"$W/gloo7.out" 2>&1
say "gloo 7 ranks rc=$? $(grep -E 'np=' "$W/gloo7.out" | tr '\n' ' ')"
timeout 200 python3 bin/gloo_allreduce.py --np 2 --sizes 256M --iters 3 >"$W/gloo2.out" 2>&1
say "gloo 2 ranks rc=$? $(grep -E 'np=' "$W/gloo2.out" | tr '\n' ' ')"
