#!/usr/bin/env bash
# Where DDP ResNet-18 b32's time over its lockstep bound goes on one GPU (7 ranks on GPU 0, the MIG path),
# with DDP's defaults: the buffer broadcast before every forward pass timed from inside the process
# (--time-ddp: its CPU time, the process group's share, when the GPU got past it) for migctl and gloo;
# without the buffer broadcast; torch.profiler traces of migctl (ranks 0, 6) with profile_summary.py; the
# 16-MiB all-reduce (the last bucket's size).
# Also DDP with the library of the build before (bin/libmigctl-old.so: the caller's marks of chained all-reduces
# waited for on the CPU) against this one's (on the device), interleaved.
# Build: make build lib, and the build before's lib as bin/libmigctl-old.so; carry ["bin/migctl",
# "bin/libmigctl.so", "bin/libmigctl-old.so"]. Output: $OUT/bcast-anatomy/. ~6 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init bcast-anatomy
DDP_DEADLINE=${DDP_DEADLINE:-420}
sums() { # tag: the --time-ddp figures of a DDP run
  say "  $1 buffer sync (cpu, pg broadcast cpu, gpu ms per rank): $(python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(json.dumps(r.get("buffer_sync")))' "$W/$1.json" 2>/dev/null)"
}
OLD=$PWD/bin/libmigctl-old.so
ddp r32-migctl-1 resnet 32 migctl --time-ddp; sums r32-migctl-1
MIGCTL_LIB=$OLD ddp r32-old-1 resnet 32 migctl --time-ddp; sums r32-old-1
ddp r32-lockstep resnet 32 none --lockstep
ddp r32-nobcast resnet 32 migctl --no-broadcast-buffers
ddp r32-gloo resnet 32 gloo --time-ddp; sums r32-gloo
ddp r32-migctl-2 resnet 32 migctl --time-ddp; sums r32-migctl-2
MIGCTL_LIB=$OLD ddp r32-old-2 resnet 32 migctl --time-ddp; sums r32-old-2
MIGCTL_TRACE=1 ddp r32-prof resnet 32 migctl --profile "$O/r32-migctl" --profile-ranks 0,6
for f in "$O"/r32-migctl.rank0.json.gz "$O"/r32-migctl.rank6.json.gz; do
  [ -f "$f" ] && { echo "== $f"; python3 examples/pytorch/profile_summary.py "$f"; } >>"$W/profiles.txt" 2>&1
done
cp "$W/profiles.txt" "$O/" 2>/dev/null
row n7-16M 7 16MiB 40 5
ddp r8-migctl resnet 8 migctl
MIGCTL_LIB=$OLD ddp r8-old resnet 8 migctl
