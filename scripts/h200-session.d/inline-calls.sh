#!/usr/bin/env bash
# Synchronous collectives run on the caller's goroutine when nothing is queued (trainer, ba53b62) vs
# the worker hand-off before it, one H200, 7 ranks on GPU 0: 8 KiB all-reduce with the previous and
# the new migctl interleaved three times, 2 ranks twice; then the PyTorch per-call probe with the new
# library beside the new bench in the same call (issue 11's <= 20 us overhead row).
# Build: make build lib; cp bin/migctl bin/migctl-new; a build of the commit before as bin/migctl-old;
# rm bin/migctl (~56 MB with libmigctl.so); carry ["bin"]. Output: $OUT/inline/summary.txt. ~1.5 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init inline
for i in 1 2 3; do
  for v in old new; do M=bin/migctl-$v row "r7-8K-$v-$i" 7 8KiB 3000 300; done
done
for i in 1 2; do
  for v in old new; do M=bin/migctl-$v row "r2-8K-$v-$i" 2 8KiB 3000 300; done
done
M=bin/migctl-new
ovh new-1
M=bin/migctl-new row r7-8K-new-ovh 7 8KiB 3000 300
ovh new-2
