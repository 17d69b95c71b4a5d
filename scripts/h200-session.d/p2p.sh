#!/usr/bin/env bash
# Point-to-point transfers on one H200 (torch 2.11, CUDA tensors, ranks on GPU 0 as MIG instances would be):
# python/tests/p2p_check.py at 2 and 7 ranks; examples/pytorch/pipeline.py over migctl vs gloo (the peer, through
# host memory) in the same run at 4 and 7 stages, a compute-heavy and a transfer-heavy shape; and the checks of
# last-torch.sh (uneven all-to-all on CUDA, destroy_process_group freeing a group under torch 2.11).
# Build: make build lib; carry ["bin"]. Output: $OUT/p2p/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init p2p
python3 -c 'import torch; print("torch", torch.__version__)' >>"$S" 2>&1
for np in 2 7; do
  timeout 150 $M run --gpus 0 --np $np -q --timeout 60s -- python3 python/tests/p2p_check.py --device cuda >"$W/p2p-$np.out" 2>&1
  say "p2p_check cuda np=$np rc=$? clean: $(grep -c '"failures": \[\]' "$W/p2p-$np.out") of $np; $(grep -o '"failures": \[[^]]*\]' "$W/p2p-$np.out" | sort | uniq -c | head -3 | cut -c1-400)"
done
pipe() { # tag np backend [args...]
  local tag=$1 np=$2 b=$3; shift 3
  timeout 150 $M run --gpus 0 --np "$np" -q --timeout 60s -- python3 examples/pytorch/pipeline.py --backend "$b" "$@" \
    >"$W/$tag.out" 2>&1
  say "$tag rc=$? $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/$tag.out" | python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); print("ms/step=%.2f steps/s=%.2f diff=%s losses[:3]=%s" % (r["step_ms"], r["steps_per_s"], r["max_diff_whole"], r["losses"][:3]))' 2>/dev/null || tail -c 300 "$W/$tag.out")"
}
for np in 4 7; do
  for b in migctl gloo; do pipe "pipe-np$np-$b" $np $b --check --steps 20; done
  for b in migctl gloo; do pipe "pipe-heavy-np$np-$b" $np $b --width 4096 --batch 2048 --micro 8 --steps 20; done
done
bash scripts/h200-session.d/last-torch.sh >/dev/null 2>&1; cat "$OUT/lasttorch/summary.txt" >>"$S" 2>/dev/null
