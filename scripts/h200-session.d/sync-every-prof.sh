#!/usr/bin/env bash
# torch.profiler traces (ranks 0 and 6, steps 10-12: the first window's first three) of ResNet-18 b32 at
# --sync-every 5, 7 ranks on GPU 0: DDP with no gradient traffic (--probe-hook noop) and migctl with DDP's
# defaults, to see where the buffer broadcast's 1.2-2.6 ms a step go once the host runs ahead (sync-every-probe.sh).
# Build: make build lib; carry ["bin/migctl", "bin/libmigctl.so"]. Output: $OUT/sync-every-prof/ (summary.txt,
# logs.tgz, *.json.gz). ~1.5 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init sync-every-prof
SE=(--steps 30 --sync-every 5)
ddp noop-k5 resnet 32 migctl --probe-hook noop "${SE[@]}"
ddp noop-k5-prof resnet 32 migctl --probe-hook noop "${SE[@]}" --profile "$O/noop-k5" --profile-ranks 0,6
ddp migctl-k5-prof resnet 32 migctl "${SE[@]}" --profile "$O/migctl-k5" --profile-ranks 0,6
for f in "$O"/*.json.gz; do
  say "== $(basename "$f")"; python3 examples/pytorch/profile_summary.py "$f" >>"$S" 2>&1
done
