#!/usr/bin/env bash
# Point-to-point, second pass (one H200 or H100, torch 2.x, ranks on GPU 0): p2p_check on CUDA at 2 and 7 ranks;
# ping-pong migctl vs gloo (scripts/p2p_bench.py); examples/pytorch/pipeline.py with staged receives (the
# default), MIGCTL_TUNING=recv=direct and gloo, same run.
# Build: make build lib; carry ["bin"]. Output: $OUT/p2p2/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init p2p2
python3 -c 'import torch; print("torch", torch.__version__)' >>"$S" 2>&1
for np in 2 7; do
  timeout 150 $M run --gpus 0 --np $np -q --timeout 60s -- python3 python/tests/p2p_check.py --device cuda >"$W/p2p-$np.out" 2>&1
  say "p2p_check cuda np=$np rc=$? clean: $(grep -c '"failures": \[\]' "$W/p2p-$np.out") of $np; checks: $(grep -o '"checks": [0-9]*' "$W/p2p-$np.out" | sort | uniq -c | tr '\n' ' ') $(grep -o '"failures": \[[^]]*\]' "$W/p2p-$np.out" | sort | uniq -c | head -3 | cut -c1-400)"
done
for b in migctl gloo; do
  timeout 120 $M run --gpus 0 --np 2 -q --timeout 60s -- python3 scripts/p2p_bench.py --backend $b >"$W/bench-$b.out" 2>&1
  say "pingpong $b rc=$? $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/bench-$b.out" | python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); print(" ".join("%dB:%.1fus,%.2fGB/s" % (x["bytes"], x["one_way_us"], x["gbps"]) for x in r["rows"]))' 2>/dev/null || tail -c 300 "$W/bench-$b.out")"
done
pipe() { # tag np backend tuning [args...]
  local tag=$1 np=$2 b=$3 tun=$4; shift 4
  MIGCTL_TUNING=$tun timeout 150 $M run --gpus 0 --np "$np" -q --timeout 60s -- python3 examples/pytorch/pipeline.py --backend "$b" "$@" \
    >"$W/$tag.out" 2>&1
  say "$tag rc=$? $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/$tag.out" | python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); print("ms/step=%.2f steps/s=%.2f losses[:3]=%s" % (r["step_ms"], r["steps_per_s"], r["losses"][:3]))' 2>/dev/null || tail -c 300 "$W/$tag.out")"
}
for np in 4 7; do
  pipe "pipe-np$np-staged" $np migctl "" --steps 30
  pipe "pipe-np$np-direct" $np migctl recv=direct --steps 30
  pipe "pipe-np$np-gloo" $np gloo "" --steps 30
done
pipe "pipe-heavy-np4-staged" 4 migctl "" --width 4096 --batch 2048 --micro 8 --steps 20
pipe "pipe-heavy-np4-direct" 4 migctl recv=direct --width 4096 --batch 2048 --micro 8 --steps 20
