#!/usr/bin/env bash
# How long DDP's buffer sync and the process group's broadcast calls within it keep each rank's CPU, at
# --sync-every 5 and 1 (examples/pytorch --time-ddp: means per rank over the timed steps), ResNet-18 b32, 7 ranks on
# GPU 0, migctl, two rounds interleaved; with the host ahead (K=5) a broadcast call that waits shows here. Build:
# make build lib; carry ["bin/migctl", "bin/libmigctl.so"]. Output: $OUT/sync-every-timeddp/. ~1.5 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init sync-every-timeddp
bs() { # tag: the buffer-sync figures of ddp's JSON, per rank
  say "  $1 $(python3 -c 'import json,sys; b=json.loads(open(sys.argv[1]).readline())["buffer_sync"]; print(" ".join("%s=[%s]" % (k, ",".join("%.2f" % x for x in v)) for k, v in b.items()))' "$W/$1.json" 2>/dev/null)"
}
for i in 1 2; do
  ddp "k5-$i" resnet 32 migctl --time-ddp --steps 30 --sync-every 5; bs "k5-$i"
  ddp "k1-$i" resnet 32 migctl --time-ddp --steps 30; bs "k1-$i"
done
