#!/usr/bin/env bash
# Arena geometry where the link, not host memory, binds (the H100 hosts: duplex 68 GiB/s, host memory
# under DMA ~149 GiB/s; the H200 grids of 2026-12-01 were host-memory bound): 256 MiB fp32 all-reduce,
# 7 and 2 ranks on GPU 0, chunk x slots x copies in flight, reduce workers, each row twice interleaved
# with the default. Build: make build; carry ["bin/migctl"]. Output: $OUT/linkgrid/. ~4 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init linkgrid
for i in 1 2; do
  row "np7-default-$i" 7 256MiB 10 3
  for c in 1MiB 4MiB; do row "np7-chunk$c-$i" 7 256MiB 10 3 --chunk $c; done
  row "np7-slots16-$i" 7 256MiB 10 3 --slots 16
  row "np7-chunk1MiB-slots16-$i" 7 256MiB 10 3 --chunk 1MiB --slots 16
  row "np7-depth4-$i" 7 256MiB 10 3 --depth 4
  row "np7-depth1-$i" 7 256MiB 10 3 --depth 1
  row "np7-chunk4MiB-depth4-$i" 7 256MiB 10 3 --chunk 4MiB --depth 4
  row "np7-workers1-$i" 7 256MiB 10 3 --reduce-workers 1
  row "np7-workers3-$i" 7 256MiB 10 3 --reduce-workers 3
  row "np2-default-$i" 2 256MiB 10 3
  row "np2-chunk4MiB-$i" 2 256MiB 10 3 --chunk 4MiB
  row "np2-chunk16MiB-$i" 2 256MiB 10 3 --chunk 16MiB
  row "np2-depth4-$i" 2 256MiB 10 3 --depth 4
  row "np2-hoststaged-$i" 2 256MiB 10 3 --algo hoststaged
  row "np7-32M-default-$i" 7 32MiB 20 3
  row "np7-32M-chunk1MiB-$i" 7 32MiB 20 3 --chunk 1MiB
  row "np7-32M-depth4-$i" 7 32MiB 20 3 --depth 4
done
