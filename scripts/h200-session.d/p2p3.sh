#!/usr/bin/env bash
# Point-to-point, third pass (one H200 or H100, torch 2.x, ranks on GPU 0): transfers started on the issuing
# thread (C ABI 11, the default) vs through the dispatcher (MIGCTL_LIB_TRANSFER_HERE=0), interleaved twice,
# beside gloo and the 2-rank broadcast floor (`migctl bench broadcast`); the 4-stage pipeline both ways and gloo.
# Build: make build lib; carry ["bin"]. Output: $OUT/p2p3/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
PP_ITERS=200
session_init p2p3
python3 -c 'import torch; print("torch", torch.__version__)' >>"$S" 2>&1
timeout 120 $M bench broadcast --backend gpu --transport shm --gpu 0 --np 2 -b 8KiB -e 4MiB -f 32 -n 20 -w 3 -c 1 -o json \
  >"$W/bcast.json" 2>"$W/bcast.err"
say "bench broadcast np=2 rc=$? $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join("%dB:%.1fus,wrong=%d" % (r["bytes"], r["timeUs"], r["wrong"]) for r in d["rows"]))' "$W/bcast.json" 2>/dev/null || tail -c 300 "$W/bcast.err")"
for i in 1 2; do
  pp "pp-here-$i" migctl MIGCTL_LIB_TRANSFER_HERE=1
  pp "pp-disp-$i" migctl MIGCTL_LIB_TRANSFER_HERE=0
  pp "pp-gloo-$i" gloo X=1
done
timeout 150 $M run --gpus 0 --np 2 -q --timeout 60s -- python3 python/tests/p2p_check.py --device cuda >"$W/p2p-check.out" 2>&1
say "p2p_check cuda np=2 rc=$? clean: $(grep -c '"failures": \[\]' "$W/p2p-check.out") of 2"
pipe() { # tag backend VAR=value
  local tag=$1 b=$2; shift 2
  env "$@" timeout 150 $M run --gpus 0 --np 4 -q --timeout 60s -- python3 examples/pytorch/pipeline.py --backend "$b" --steps 30 \
    >"$W/$tag.out" 2>&1
  say "$tag rc=$? $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/$tag.out" | python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); print("ms/step=%.2f losses[:3]=%s" % (r["step_ms"], r["losses"][:3]))' 2>/dev/null || tail -c 300 "$W/$tag.out")"
}
pipe pipe-here migctl MIGCTL_LIB_TRANSFER_HERE=1
pipe pipe-disp migctl MIGCTL_LIB_TRANSFER_HERE=0
pipe pipe-gloo gloo X=1
