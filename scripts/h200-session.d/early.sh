#!/usr/bin/env bash
# Results early on the device (C ABI 15, migctl_wait_stream; MIGCTL_TUNING=complete=device, off by default): the Work
# of a chained all-reduce of CUDA tensors completes once every rank's reduction is done and this rank's last
# copies back are queued, the waiter's stream ordered after them, as NCCL's Works do. One call, ranks on GPU 0
# (the MIG path: shm, host-staged, under MPS):
#  1. checks first (a stream waiting for the wrong thing would hang or read stale data): chain_check.py on CUDA
#     tensors at 7 and 2 ranks (every element read through the current stream only; the library's early counter
#     must move), the same without complete=device (it must not), gpu_checks.py at 7 ranks with it;
#  2. DDP, early (complete=device) against the default, interleaved, two rounds: ResNet-18 b32 (with its lockstep
#     bound), ResNet-18 b8, GPT b4; gloo at b8 and b4 (the ratios), losses against gloo;
#  3. issue 9's one-GPU rows: bench 256 MiB at 7 and 2 ranks, 8 KiB at 7, gloo's 7-rank 256 MiB; the piece rule
#     (auto) against whole chunks at 1-16 MiB; the per-call cost.
# Build: make build lib && cp ../shared/bench/gloo_allreduce.py bin/; carry ["bin/migctl", "bin/libmigctl.so",
# "bin/gloo_allreduce.py"]. Output: $OUT/early/{summary.txt,logs.tgz}. 7-9 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init early
MIGCTL_TUNING=complete=device check chain-cuda-7 7 60 python/tests/chain_check.py --device cuda
say "early per rank: $(grep -o '"early": [0-9]*' "$W/chain-cuda-7.out" | cut -d' ' -f2 | tr '\n' ' ')"
if [ "$(grep -c '"failures": \[\]' "$W/chain-cuda-7.out")" != 7 ]; then
  # the early path is wrong or hangs here: measure the rows only, on the default path
  say "chain_check failed with results early: no DDP A/B"
  SKIP_AB=1
fi
MIGCTL_TUNING=complete=device check chain-cuda-2 2 60 python/tests/chain_check.py --device cuda --calls 60
check chain-cuda-7-cpu 7 60 python/tests/chain_check.py --device cuda
MIGCTL_TUNING=complete=device check gpu-checks-7 7 60 python/tests/gpu_checks.py
timeout 120 $M bench limits -o json >"$W/limits.json" 2>"$W/limits.err"
say "limits rc=$? $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d)[:400])' "$W/limits.json" 2>/dev/null)"
DDP_DEADLINE=${DDP_DEADLINE:-330}
earlyab() { # tag model batch [args...]: DDP over migctl, results early (TAG-early), then not (TAG-cpu)
  local tag=$1; shift
  MIGCTL_TUNING=complete=device ddp "$tag-early" "$1" "$2" migctl "${@:3}"
  ddp "$tag-cpu" "$1" "$2" migctl "${@:3}"
}
[ -n "${SKIP_AB:-}" ] && DDP_DEADLINE=0
earlyab resnet32-1 resnet 32
ddp resnet32-lockstep resnet 32 none --lockstep
earlyab gpt4-1 gpt 4
earlyab resnet8-1 resnet 8
ddp gpt4-gloo gpt 4 gloo
ddp resnet8-gloo resnet 8 gloo
earlyab resnet32-2 resnet 32
earlyab gpt4-2 gpt 4
earlyab resnet8-2 resnet 8
losses "gpt4 (early, cpu)" "$W/gpt4-gloo.json" "$W/gpt4-1-early.json" "$W/gpt4-1-cpu.json"
[ "${ROWS:-1}" = 0 ] && exit 0 # ROWS=0: the checks and DDP only (a short call)
row np7-256M-1 7 256MiB 10 3
row np7-8K 7 8KiB 2000 200
row np2-256M 2 256MiB 10 3
timeout 100 python3 bin/gloo_allreduce.py --np 7 --sizes 256M --iters 3 >"$W/gloo.out" 2>&1
say "gloo-np7-256M rc=$? $(grep -v '^#' "$W/gloo.out" | tail -2 | tr '\n' ' ')"
coll piece-auto bin/migctl 7 allreduce -b 1MiB -e 16MiB -f 2 -n 30 -w 5
coll piece-chunk bin/migctl 7 allreduce -b 1MiB -e 16MiB -f 2 -n 30 -w 5 --piece chunk
[ "$SECONDS" -lt 500 ] && row np7-256M-2 7 256MiB 10 3
[ "$SECONDS" -lt 520 ] && ovh default
