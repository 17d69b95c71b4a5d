#!/usr/bin/env bash
# On a host whose link binds (duplex ~69 GiB/s), whether the 7-rank 256-MiB all-reduce's default geometry
# (2 MiB chunks, 2 copies in flight) loses to 1- or 4-MiB chunks or 1 copy in flight, as one round of
# link-grid.sh suggested (2026-12-07): four rounds interleaved, and 16 MiB (DDP's last ResNet bucket).
# Build: make build; carry ["bin/migctl"]. Output: $OUT/linkconfirm/. ~2 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init linkconfirm
for i in 1 2 3 4; do
  row "np7-default-$i" 7 256MiB 10 3
  row "np7-chunk1MiB-$i" 7 256MiB 10 3 --chunk 1MiB
  row "np7-chunk4MiB-$i" 7 256MiB 10 3 --chunk 4MiB
  row "np7-depth1-$i" 7 256MiB 10 3 --depth 1
done
for i in 1 2; do
  row "np7-16M-default-$i" 7 16MiB 30 5
  row "np7-16M-chunk1MiB-$i" 7 16MiB 30 5 --chunk 1MiB
  row "np7-16M-depth1-$i" 7 16MiB 30 5 --depth 1
done
