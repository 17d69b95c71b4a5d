#!/usr/bin/env bash
# Where the step's end goes with copies back queued at the issue (MIGCTL_TUNING=complete=queued) against the
# default: torch.profiler traces (ranks 0 and 6) of DDP ResNet-18 b32 at DDP's defaults, 7 ranks on GPU 0, each
# summarized (profile_summary.py: CPU gaps, copies per stream), and a run of each without the profiler. queued.sh
# found queued level with the default (48.2-48.5 vs 48.8 ms): this is to see whether the Future now completes
# at the last bucket's issue and what the host then waits for (the buffer broadcast behind the all-reduce still
# in flight?). Build: make build lib; carry ["bin/migctl", "bin/libmigctl.so"]. Output: $OUT/queued-prof/. ~2 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init queued-prof
ddp default resnet 32 migctl
MIGCTL_TUNING=complete=queued ddp queued resnet 32 migctl
ddp default-prof resnet 32 migctl --profile "$O/default" --profile-ranks 0,6
MIGCTL_TUNING=complete=queued ddp queued-prof resnet 32 migctl --profile "$O/queued" --profile-ranks 0,6
MIGCTL_TUNING=complete=queued ddp queued-timeddp resnet 32 migctl --time-ddp
ddp default-timeddp resnet 32 migctl --time-ddp
for f in "$O"/*.json.gz; do
  say "== $(basename "$f")"; python3 examples/pytorch/profile_summary.py "$f" >>"$S" 2>&1
done
