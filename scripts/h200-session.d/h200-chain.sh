#!/usr/bin/env bash
# Chained all-reduces on an H200 in one call (ranks on GPU 0, the MIG path): issue 9's one-GPU rows at this
# build (bench 256 MiB at 7 and 2 ranks, 8 KiB at 7; gloo's 7-rank 256 MiB in the same call), chain_check.py on
# CUDA tensors (the library's chained counter must move), `--split 4`
# with --chain on and off, then DDP with chaining (default) against MIGCTL_TUNING=chain=off, interleaved:
# ResNet-18 b32 twice (and its lockstep bound), GPT b4 and ResNet-18 b8 (and gloo). Build: make build lib &&
# cp ../shared/bench/gloo_allreduce.py bin/; carry ["bin/migctl", "bin/libmigctl.so", "bin/gloo_allreduce.py"].
# Output: $OUT/h200-chain/{summary.txt,logs.tgz}. ~6 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init h200-chain
check chain-cuda-7 7 120 python/tests/chain_check.py --device cuda
check chain-cuda-2 2 120 python/tests/chain_check.py --device cuda --calls 60
timeout 120 $M bench limits -o json >"$W/limits.json" 2>"$W/limits.err"
say "limits rc=$? $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d)[:400])' "$W/limits.json" 2>/dev/null)"
row np7-256M-1 7 256MiB 10 3
row np2-256M 2 256MiB 10 3
row np7-8K 7 8KiB 2000 200
row np7-256M-2 7 256MiB 10 3
timeout 150 python3 bin/gloo_allreduce.py --np 7 --sizes 256M --iters 5 >"$W/gloo.out" 2>&1
say "gloo-np7-256M rc=$? $(grep -v '^#' "$W/gloo.out" | tail -2 | tr '\n' ' ')"
for ch in on off; do
  row "split4-64M-np7-$ch" 7 64MiB 20 3 --split 4 --chain $ch
done
DDP_DEADLINE=${DDP_DEADLINE:-400}
for i in 1 2; do chainab "resnet32-$i" resnet 32; done
ddp resnet32-lockstep resnet 32 none --lockstep
chainab gpt4 gpt 4
ddp gpt4-gloo gpt 4 gloo
chainab resnet8 resnet 8
ddp resnet8-gloo resnet 8 gloo
losses "gpt4 (chain, off)" "$W/gpt4-gloo.json" "$W/gpt4-chain.json" "$W/gpt4-off.json"
[ "$SECONDS" -lt 500 ] && check gpu-checks-7 7 60 python/tests/gpu_checks.py
