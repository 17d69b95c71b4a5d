#!/usr/bin/env bash
# The one-GPU targets of issues 9 and 11 at this build, in one call (7 and 2 ranks on GPU 0, the MIG path:
# shm, host-staged): `migctl bench allreduce` rows of 256 MiB and 8 KiB with LIMIT/%LIMIT, gloo in the same
# call (bin/gloo_allreduce.py), the PyTorch per-call probe beside a bench 8-KiB row, then issue 11's DDP
# table (ResNet-18 b32/b8, GPT b4/b32: migctl, gloo, none, none --lockstep). Rows in order of what the
# issues ask first; DDP rows stop at DDP_DEADLINE (default 520 s). Build: make build lib && cp
# ../shared/bench/gloo_allreduce.py bin/; carry ["bin/migctl", "bin/libmigctl.so", "bin/gloo_allreduce.py"].
# Output: $OUT/targets/{summary.txt,logs.tgz}. ~9 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init targets
nproc >>"$S"
timeout 120 $M bench limits -o json >"$W/limits.json" 2>"$W/limits.err"
say "limits rc=$? $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d)[:600])' "$W/limits.json" 2>/dev/null)"
for i in 1 2; do
  row "np7-256M-$i" 7 256MiB 10 3
  row "np2-256M-$i" 2 256MiB 10 3
  row "np7-8K-$i" 7 8KiB 2000 200
done
gloo() { # tag np size iters
  timeout 150 python3 bin/gloo_allreduce.py --np "$2" --sizes "$3" --iters "$4" >"$W/$1.out" 2>&1
  say "$1 rc=$? $(grep -v '^#' "$W/$1.out" | tail -2 | tr '\n' ' ')"
}
gloo gloo-np7-256M 7 256M 5
gloo gloo-np2-256M 2 256M 5
gloo gloo-np7-8K 7 8K 200
ovh default
row np7-8K-ovh 7 8KiB 2000 200
ovh default-2
DDP_DEADLINE=${DDP_DEADLINE:-520}
ddp resnet8-migctl resnet 8 migctl
ddp resnet8-gloo resnet 8 gloo
ddp resnet8-none resnet 8 none
ddp gpt4-migctl gpt 4 migctl
ddp gpt4-gloo gpt 4 gloo
ddp gpt4-none gpt 4 none
ddp resnet32-migctl resnet 32 migctl
ddp resnet32-none resnet 32 none
ddp resnet32-lockstep resnet 32 none --lockstep
ddp resnet32-gloo resnet 32 gloo
ddp gpt32-migctl gpt 32 migctl
ddp gpt32-none gpt 32 none
ddp gpt32-gloo gpt 32 gloo
ddp resnet8-migctl-2 resnet 8 migctl
ddp gpt4-migctl-2 gpt 4 migctl
