#!/usr/bin/env bash
# Chained host-staged all-reduces (an all-reduce's successor starts once its copies out are done, so the next
# bucket's copies out run while this one's copies back do), ranks on GPU 0 under MPS: correctness on CUDA
# tensors (python/tests/chain_check.py, gpu_checks.py), `migctl bench allreduce --split K` (a message as K
# asynchronous all-reduces back to back) with --chain on and off, then DDP with chaining (default) against
# MIGCTL_TUNING=chain=off, interleaved: ResNet-18 b32 twice (with its lockstep bound), ResNet-18 b8 and GPT b4
# twice (with gloo and their lockstep bounds), GPT b32; GPT b4's losses against gloo's. Build: make build lib;
# carry ["bin/migctl", "bin/libmigctl.so"]. Output: $OUT/chain/{summary.txt,logs.tgz}. ~9 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init chain
check chain-cuda-7 7 120 python/tests/chain_check.py --device cuda
check chain-cuda-2 2 120 python/tests/chain_check.py --device cuda --calls 60
# migctl bench: one message as K asynchronous all-reduces of its parts, back to back (DDP's buckets), chained or not
for i in 1 2; do
  for ch in on off; do
    row "split4-64M-np7-$ch-$i" 7 64MiB 20 3 --split 4 --chain $ch
  done
done
for ch in on off; do
  row "split10-256M-np7-$ch" 7 256MiB 5 2 --split 10 --chain $ch
  row "split4-64M-np2-$ch" 2 64MiB 20 3 --split 4 --chain $ch
  timeout 100 $M bench allreduce --backend host --np 7 -b 64MiB -e 64MiB -n 10 -w 2 -c 1 --split 4 --chain $ch -o json \
    >"$W/host-split-$ch.json" 2>&1
  say "host-split4-64M-np7-$ch rc=$? $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["rows"][0]; print("us=%.1f wrong=%d" % (r["timeUs"], r["wrong"]))' "$W/host-split-$ch.json" 2>/dev/null)"
done
DDP_DEADLINE=${DDP_DEADLINE:-480}
for i in 1 2; do chainab "resnet32-$i" resnet 32; done
ddp resnet32-lockstep resnet 32 none --lockstep
for i in 1 2; do
  chainab "gpt4-$i" gpt 4
  chainab "resnet8-$i" resnet 8
done
ddp gpt4-gloo gpt 4 gloo
ddp resnet8-gloo resnet 8 gloo
losses "gpt4 (chain, off; round 1)" "$W/gpt4-gloo.json" "$W/gpt4-1-chain.json" "$W/gpt4-1-off.json"
ddp resnet8-lockstep resnet 8 none --lockstep
ddp gpt4-lockstep gpt 4 none --lockstep
[ "$SECONDS" -lt 520 ] && check gpu-checks-7 7 60 python/tests/gpu_checks.py
chainab gpt32 gpt 32
