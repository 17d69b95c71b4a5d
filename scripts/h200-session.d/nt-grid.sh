#!/usr/bin/env bash
# Non-temporal result stores as the gpu backend's default, and the arena's depth with them (issue 9's
# 256-MiB rows on one H200), one call, every row beside its twin in the same call:
#  1. 256 MiB, 2 and 7 ranks, defaults (NT stores now on for the gpu backend) vs MIGCTL_STREAM_STORES=0,
#     interleaved twice;
#  2. the arena's depth: 7 ranks chunk 2 MiB slots 2/3/4 (a working set that may stay in the 300-MiB
#     last-level cache: then plain stores may win again, so slots 3 both ways), 2 ranks chunk 8 MiB
#     slots 2/4 and 4 MiB slots 8; reduce workers 3 (7 ranks) and 8 (2 ranks);
#  3. 8 KiB, 7 ranks: MIGCTL_PREFETCH=0/1 interleaved three times (software prefetch of the small
#     reduction's sources), one traced CPU-path row (where the 64 us go);
#  4. gloo 256 MiB and 8 KiB, 2 and 7 ranks (the peer);
#  5. if time is left: DDP 7 ranks ResNet-18 b8 and GPT b4, migctl vs gloo vs none (issue 11's 3x rows).
# Build here: make build lib; cp ../shared/bench/gloo_allreduce.py bin/; carry ["bin"] (migctl,
# libmigctl.so, gloo script: ~35 MB). Output: $OUT/ntgrid/summary.txt, logs.tgz. About 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init ntgrid

say "== 1. 256 MiB defaults (NT) vs MIGCTL_STREAM_STORES=0"
for i in 1 2; do
  for np in 2 7; do
    row "r$np-256M-default-$i" "$np" 256MiB 10 3
    MIGCTL_STREAM_STORES=0 row "r$np-256M-plain-$i" "$np" 256MiB 10 3
  done
done

say "== 2. depth and workers"
for s in 2 3 4; do row "r7-256M-c2M-s$s" 7 256MiB 10 3 --chunk 2MiB --slots "$s"; done
MIGCTL_STREAM_STORES=0 row r7-256M-c2M-s3-plain 7 256MiB 10 3 --chunk 2MiB --slots 3
row r7-256M-w3 7 256MiB 10 3 --reduce-workers 3
for s in 2 4; do row "r2-256M-c8M-s$s" 2 256MiB 10 3 --chunk 8MiB --slots "$s"; done
row r2-256M-c4M-s8 2 256MiB 10 3 --chunk 4MiB --slots 8
row r2-256M-w8 2 256MiB 10 3 --reduce-workers 8

say "== 3. 8 KiB, 7 ranks, software prefetch of the small reduction"
for i in 1 2 3; do
  MIGCTL_PREFETCH=0 row "r7-8K-pf0-$i" 7 8KiB 2000 200
  MIGCTL_PREFETCH=1 row "r7-8K-pf1-$i" 7 8KiB 2000 200
done
MIGCTL_TRACE=1 row r7-8K-trace 7 8KiB 1000 100
say "trace: $(grep -m1 -A8 'hoststaged-small 8192 B' "$W/r7-8K-trace.err" | tr -s ' ' | head -c 1600)"

say "== 4. gloo"
timeout 150 python3 bin/gloo_allreduce.py --np 2,7 --sizes 8K,256M --iters 5 >"$W/gloo.txt" 2>"$W/gloo.err"
say "gloo rc=$? $(grep -h 'np=' "$W/gloo.txt" | tr '\n' ' ')"

say "== 5. DDP (7 ranks, GPU 0), if time is left (${SECONDS}s so far)"
DDP_DEADLINE=430
for m in "resnet 8" "gpt 4"; do
  set -- $m
  ddp "$1-$2-migctl" "$1" "$2" migctl
  ddp "$1-$2-gloo" "$1" "$2" gloo
  ddp "$1-$2-none" "$1" "$2" none
done
