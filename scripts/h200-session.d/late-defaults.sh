#!/usr/bin/env bash
# The defaults at the end of the 2026-12-01 late session, one H200, beside their previous selves and
# the peer in the same call: 8 KiB 7 ranks default (copy kernel in, picked for 7 ranks on one device)
# vs MIGCTL_H2D=2drows, three pairs; 256 MiB 2 and 7 ranks default (non-temporal result stores) vs
# MIGCTL_STREAM_STORES=0, two pairs; gloo 8 KiB and 256 MiB; PyTorch 7 ranks: gpu_checks.py, the
# per-call cost default vs 2drows; DDP ResNet-18 b8 and GPT b4, migctl vs gloo vs none.
# Build: make build lib; cp ../shared/bench/gloo_allreduce.py bin/; nothing else in bin/; carry ["bin"].
# Output: $OUT/late/summary.txt, logs.tgz. About 6 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init late
h2d() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("smallH2D", "?"))' "$W/$1.json" 2>/dev/null; }

say "== 8 KiB, 7 ranks"
for i in 1 2 3; do
  row "r7-8K-default-$i" 7 8KiB 3000 300
  MIGCTL_H2D=2drows row "r7-8K-rows-$i" 7 8KiB 3000 300
done
say "default picked smallH2D=$(h2d r7-8K-default-1); forced: $(h2d r7-8K-rows-1)"
row r2-8K-default 2 8KiB 2000 200
say "2 ranks picked smallH2D=$(h2d r2-8K-default)"

say "== 256 MiB"
for i in 1 2; do
  for np in 7 2; do
    row "r$np-256M-default-$i" "$np" 256MiB 10 3
    MIGCTL_STREAM_STORES=0 row "r$np-256M-plain-$i" "$np" 256MiB 10 3
  done
done

say "== gloo"
timeout 150 python3 bin/gloo_allreduce.py --np 2,7 --sizes 8K,256M --iters 5 >"$W/gloo.txt" 2>"$W/gloo.err"
say "gloo rc=$? $(grep -h 'np=' "$W/gloo.txt" | tr '\n' ' ')"

say "== PyTorch, 7 ranks"
timeout 200 $M run --gpus 0 --np 7 -q --timeout 120s -- python3 python/tests/gpu_checks.py >"$W/gpu-checks.out" 2>&1
say "gpu_checks rc=$?"; grep -h '"failures"' "$W/gpu-checks.out" | head -1 | cut -c 1-300 >>"$S"
for h in default 2drows default 2drows; do
  ovh "h2d=$h" MIGCTL_H2D="${h#default}" # empty: the default
done
timeout 60 $M bench allreduce --backend gpu --transport shm --gpu 0 --np 7 -b 8KiB -e 8KiB -n 3000 -w 300 -c 1 -o json \
  >"$W/r7-8K-bench-ovh.json" 2>/dev/null
say "bench 8K 7 ranks (same conditions as the per-call probe): $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rows"][0]["timeUs"])' "$W/r7-8K-bench-ovh.json" 2>/dev/null) us"

say "== DDP, 7 ranks (${SECONDS}s so far)"
DDP_DEADLINE=470
for m in "resnet 8" "gpt 4"; do
  set -- $m
  ddp "$1-$2-migctl" "$1" "$2" migctl
  ddp "$1-$2-gloo" "$1" "$2" gloo
  ddp "$1-$2-none" "$1" "$2" none
done
