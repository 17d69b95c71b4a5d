#!/usr/bin/env bash
# The segments' directory on a real H200 (2026-12-02, fourth part, call 4): /dev/shm passes
# `migctl run`'s new check (a GPU job starts and trains), a disk directory is refused by `migctl run`
# before any worker starts, and `migctl bench` (no such check) fails in its ranks with the trainer's
# hint naming the file system; a default bench row beside it. Build: make build lib; carry ["bin"].
# Output: $OUT/shmdir/{summary.txt,logs.tgz}. Under a minute.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init shmdir
say "fs: $(stat -f -c '%n %T' /dev/shm /tmp 2>&1 | tr '\n' ' ')"
timeout 60 $M run --gpus 0 --np 2 -q -- python3 -c 'import os; print("rank", os.environ["RANK"], "ok")' >"$W/run-devshm.out" 2>&1
say "run --gpus 0 (shm-dir /dev/shm): rc=$? $(grep -c ' ok' "$W/run-devshm.out") ranks ok"
d=$(mktemp -d /tmp/shmdisk.XXXXXX)
timeout 60 $M run --gpus 0 --np 2 -q --shm-dir "$d" -- true >"$W/run-disk.out" 2>&1
say "run --shm-dir $d: rc=$? $(head -c 400 "$W/run-disk.out")"
timeout 60 $M bench allreduce --backend gpu --transport shm --gpu 0 --np 2 -b 1MiB -e 1MiB -n 5 -w 1 -q --shm-dir "$d" \
  >"$W/bench-disk.out" 2>&1
say "bench --shm-dir $d: rc=$? $(grep -o 'the shared-memory directory[^)]*' "$W/bench-disk.out" | head -1)"
row default-2r-256M 2 256MiB 20 3
