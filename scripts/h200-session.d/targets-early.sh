#!/usr/bin/env bash
# The one-GPU targets of issues 9 and 11 at this build (targets.sh, DDP rows until DDP_DEADLINE, default 300 s),
# then results early on the device (MIGCTL_TUNING=complete=device, off by default; measured only on H100 hosts so
# far) against the default for the compute-heavy ResNet-18 b32 row, interleaved, with its lockstep bound; the host's
# CPU (lscpu, NUMA) first, for the host-memory figures. Build: make build lib && cp ../shared/bench/gloo_allreduce.py
# bin/; carry ["bin/migctl", "bin/libmigctl.so", "bin/gloo_allreduce.py"]. Output: $OUT/targets/ and
# $OUT/early-b32/ (summary.txt, logs.tgz each). ~5.5 min (318 s on an H100 host).
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "${OUT:-/tmp}/host"
lscpu >"${OUT:-/tmp}/host/lscpu.txt" 2>&1
grep -E "Model name|Socket|NUMA node|L3" "${OUT:-/tmp}/host/lscpu.txt"
DDP_DEADLINE=${DDP_DEADLINE:-300} bash scripts/h200-session.d/targets.sh
. scripts/h200-session.d/lib.sh
session_init early-b32
for i in 1 2; do
  MIGCTL_TUNING=complete=device ddp "resnet32-early-$i" resnet 32 migctl
  ddp "resnet32-default-$i" resnet 32 migctl
done
ddp resnet32-lockstep resnet 32 none --lockstep
