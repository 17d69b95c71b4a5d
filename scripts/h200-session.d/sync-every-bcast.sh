#!/usr/bin/env bash
# Is DDP's buffer broadcast before each forward pass still exposed when the host waits for the GPU only every K
# steps (--sync-every K, default 5)? ResNet-18 b32, 7 ranks on GPU 0: migctl with DDP's defaults and with
# --no-broadcast-buffers, each also with results early on the device (MIGCTL_TUNING=complete=device), and the
# lockstep bound, interleaved over two rounds. If the step's end keeps the CPU waiting for the last bucket's copies
# back, the GPU idles through the buffer sync at every step's start and --no-broadcast-buffers saves as much at
# K=5 as at K=1 (~1.5 ms). Build: make build lib; carry ["bin/migctl", "bin/libmigctl.so"]. Output:
# $OUT/sync-every-bcast/. ~4 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init sync-every-bcast
K=${K:-5}
SE=(--steps 30 --sync-every "$K")
say "host: $(lscpu | grep -E 'Model name' | sed 's/  */ /g'); K=$K"
for i in 1 2; do
  ddp "resnet32-k$K-migctl-$i" resnet 32 migctl "${SE[@]}"
  ddp "resnet32-k$K-nobcast-$i" resnet 32 migctl --no-broadcast-buffers "${SE[@]}"
  MIGCTL_TUNING=complete=device ddp "resnet32-k$K-early-$i" resnet 32 migctl "${SE[@]}"
  MIGCTL_TUNING=complete=device ddp "resnet32-k$K-early-nobcast-$i" resnet 32 migctl --no-broadcast-buffers "${SE[@]}"
  ddp "resnet32-k$K-lockstep-$i" resnet 32 none --lockstep "${SE[@]}"
done
ddp resnet32-k1-migctl resnet 32 migctl
ddp resnet32-k1-nobcast resnet 32 migctl --no-broadcast-buffers
