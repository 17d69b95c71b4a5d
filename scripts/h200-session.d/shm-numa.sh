#!/usr/bin/env bash
# This session's changes on a GPU host (one H200 or H100, ranks on GPU 0, torch 2.x): shared arenas sized by what
# the file system has free (links and groups of some ranks included) on the host's /dev/shm and on a 64 MiB tmpfs
# (a container's default), gloo beside; migctl run --numa on (the placement line, and a check under it); where an
# 8-KiB 2-rank broadcast's time goes (the floor of a point-to-point transfer) beside the 8-KiB all-reduce.
# Build: make build lib; cp ../shared/bench/gloo_allreduce.py bin/; carry ["bin"]. Output: $OUT/shmnuma/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init shmnuma
python3 -c 'import torch; print("torch", torch.__version__)' >>"$S" 2>&1
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 0 | tr 'A-Z' 'a-z' | sed 's/^0000//')
say "NUMA nodes online: $(cat /sys/devices/system/node/online 2>&1); GPU 0 at $bus: numa_node $(cat /sys/bus/pci/devices/$bus/numa_node 2>&1), local CPUs $(cat /sys/bus/pci/devices/$bus/local_cpulist 2>&1)"
say "/dev/shm: $(df -h /dev/shm | tail -1)"
SMALL=/tmp/smallshm; mkdir -p $SMALL
if mount -t tmpfs -o size=64m tmpfs $SMALL; then say "small: a 64 MiB tmpfs at $SMALL"; else say "small: cannot mount a tmpfs; skipping the small rows"; SMALL=; fi

p2p() { # tag np [run args...]
  local tag=$1 np=$2; shift 2
  timeout 150 $M run --gpus 0 --np "$np" --timeout 60s "$@" -- python3 python/tests/p2p_check.py --device cuda >"$W/$tag.out" 2>"$W/$tag.err"
  say "$tag rc=$? clean: $(grep -c '"failures": \[\]' "$W/$tag.out") of $np; $(grep -h 'placement\|warning' "$W/$tag.err" | head -3 | tr '\n' ' ')"
}
p2p p2p4 4 -q
[ -n "$SMALL" ] && p2p p2p4-small 4 -q --shm-dir $SMALL
p2p p2p2-numa-on 2 --numa on
row r7-256M 7 256MiB 5 2
[ -n "$SMALL" ] && row r7-256M-small 7 256MiB 5 2 --shm-dir $SMALL
row r2-256M 2 256MiB 5 2
[ -n "$SMALL" ] && row r2-256M-small 2 256MiB 5 2 --shm-dir $SMALL
row r7-8K 7 8KiB 300 30
timeout 200 python3 bin/gloo_allreduce.py --np 7 --sizes 8K,256M --iters 5 >"$W/gloo.out" 2>&1
say "gloo 7 ranks rc=$? $(grep -E 'np=' "$W/gloo.out" | tr '\n' ' ')"

pipe() { # tag backend [run args...]
  local tag=$1 b=$2; shift 2
  timeout 150 $M run --gpus 0 --np 4 -q --timeout 60s "$@" -- python3 examples/pytorch/pipeline.py --backend "$b" --steps 30 \
    >"$W/$tag.out" 2>&1
  say "$tag rc=$? $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/$tag.out" | python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); print("ms/step=%.2f losses[:3]=%s" % (r["step_ms"], r["losses"][:3]))' 2>/dev/null || tail -c 300 "$W/$tag.out")"
}
pipe pipe migctl
[ -n "$SMALL" ] && pipe pipe-small migctl --shm-dir $SMALL
pipe pipe-gloo gloo
ddp resnet-b8 resnet 8 migctl
[ -n "$SMALL" ] && SHMARG="--shm-dir $SMALL" && {
  timeout 80 $M run --gpus 0 --np 7 -q --shm-dir $SMALL -- python3 examples/pytorch/ddp_resnet.py --backend migctl --batch 8 --steps 25 \
    2>"$W/resnet-b8-small.err" | sed -n 's/^\[0\]: \({.*}\)$/\1/p' >"$W/resnet-b8-small.json"
  say "resnet-b8-small rc=$? $(python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); print("ms/step=%.1f identical=%s" % (r["step_ms_median_slowest_rank"], r["ranks_identical"]))' "$W/resnet-b8-small.json" 2>/dev/null)"
}
ddp resnet-b8-gloo resnet 8 gloo

MIGCTL_TRACE=1 timeout 100 $M bench broadcast --backend gpu --transport shm --gpu 0 --np 2 -b 8KiB -e 8KiB -n 500 -w 50 -c 1 \
  >"$W/bc-trace.out" 2>&1
say "broadcast 8K np=2 rc=$? $(grep -E '^8192' "$W/bc-trace.out" | head -1)"
grep -A4 'broadcast hoststaged' "$W/bc-trace.out" | head -12 >>"$S"
MIGCTL_TRACE=1 timeout 100 $M bench allreduce --backend gpu --transport shm --gpu 0 --np 2 -b 8KiB -e 8KiB -n 500 -w 50 -c 1 \
  >"$W/ar-trace.out" 2>&1
say "allreduce 8K np=2 rc=$? $(grep -E '^8192' "$W/ar-trace.out" | head -1)"
grep -A4 'allreduce hoststaged' "$W/ar-trace.out" | head -12 >>"$S"
# Link arenas: the default geometry (8 MiB x 8 slots, 192 MiB per 2-rank link) against smaller ones, one-way
# transfer times through torch's send/recv (scripts/p2p_bench.py), gloo beside.
pp pp-default migctl X=1
pp pp-4Mx4 migctl MIGCTL_TUNING=chunk=4MiB,slots=4
pp pp-2Mx4 migctl MIGCTL_TUNING=chunk=2MiB,slots=4
pp pp-1Mx2 migctl MIGCTL_TUNING=chunk=1MiB,slots=2
pp pp-gloo gloo X=1
[ -n "$SMALL" ] && umount $SMALL
