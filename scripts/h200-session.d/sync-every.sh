#!/usr/bin/env bash
# DDP with the host waiting for the GPU every K steps (examples/pytorch --sync-every K, default K=5) instead of
# every step, as a training loop that reads its loss every K steps runs: DDP's buffer broadcast and the forward
# pass's launches then overlap the GPU's previous step. For each model, migctl (defaults), migctl with results
# early on the device (MIGCTL_TUNING=complete=device), gloo, and the lockstep bound (no communication, the ranks
# meeting every K steps), all at K, over two rounds (gloo once); ResNet-18 b32 at K=1 (migctl, lockstep) too, the
# yardstick of earlier sessions. 7 ranks on GPU 0 (the MIG path: shm, host-staged). Build: make build lib;
# carry ["bin/migctl", "bin/libmigctl.so"]. Output: $OUT/sync-every/. ~5 min; SE_DEADLINE (default 540) skips the
# DDP rows left after that many seconds.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init sync-every
export DDP_DEADLINE=${SE_DEADLINE:-540}
K=${K:-5}
SE=(--steps 30 --sync-every "$K")
say "host: $(lscpu | grep -E 'Model name' | sed 's/  */ /g'); K=$K"
# in order of what matters most (the compute-heavy ResNet row is issue 11's unmet must), so that a call cut short
# keeps it
se() { # round model batch
  local i=$1 m=$2 b=$3
  ddp "$m$b-k$K-migctl-$i" "$m" "$b" migctl "${SE[@]}"
  MIGCTL_TUNING=complete=device ddp "$m$b-k$K-early-$i" "$m" "$b" migctl "${SE[@]}"
  { [ "$i" = 1 ] || [ "$m$b" = resnet32 ]; } && ddp "$m$b-k$K-lockstep-$i" "$m" "$b" none --lockstep "${SE[@]}"
  [ "$i" = 1 ] && ddp "$m$b-k$K-gloo" "$m" "$b" gloo "${SE[@]}"
}
se 1 resnet 32
ddp resnet32-k1-migctl resnet 32 migctl
ddp resnet32-k1-lockstep resnet 32 none --lockstep
se 1 resnet 8
se 1 gpt 4
se 2 resnet 32
se 2 resnet 8
se 2 gpt 4
losses resnet32-k$K "$W/resnet32-k$K-gloo.json" "$W/resnet32-k$K-migctl-1.json" "$W/resnet32-k$K-early-1.json"
losses gpt4-k$K "$W/gpt4-k$K-gloo.json" "$W/gpt4-k$K-migctl-1.json" "$W/gpt4-k$K-early-1.json"
