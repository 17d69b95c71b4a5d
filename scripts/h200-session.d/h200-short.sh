#!/usr/bin/env bash
# The H200 rows of issues 9 and 11 that matter most, in ~4.5 min (for a session with little device time left):
# 256 MiB at 7 and 2 ranks and 8 KiB at 7 (bench, -c 1), gloo's 7-rank 256 MiB, the per-call probe beside an 8-KiB
# row, then DDP ResNet-18 b32 (defaults, results early, lockstep bound), ResNet-18 b8 and GPT b4 (migctl, gloo).
# REQUIRE_H200=1: stop at once on another card (a call for nvidia-h200 may get an H100). Ranks on GPU 0 (the MIG
# path: shm, host-staged). Build: make build lib && cp ../shared/bench/gloo_allreduce.py bin/; carry ["bin/migctl",
# "bin/libmigctl.so", "bin/gloo_allreduce.py"]. Output: $OUT/short/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init short
if [ -n "${REQUIRE_H200:-}" ] && ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  say "REQUIRE_H200: not an H200 ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)); nothing run"
  exit 3
fi
timeout 120 $M bench limits -o json >"$W/limits.json" 2>"$W/limits.err"
say "limits rc=$? $(python3 -c 'import json,sys; g=json.load(open(sys.argv[1]))["limits"]["gpus"][0]; print(g["name"], "h2d=%.1f d2h=%.1f duplex=%.1f contended=%.1f hostmem=%.1f" % (g["h2dGiBs"], g["d2hGiBs"], g["duplexGiBs"], g.get("contendedCopyGiBs", 0), g.get("hostMemUnderDMAGiBs", 0)))' "$W/limits.json" 2>/dev/null)"
# in order of what the issues ask first, so that a call cut short keeps the rows that matter most
row np7-256M-1 7 256MiB 10 3
row np2-256M 2 256MiB 10 3
ddp resnet32-migctl resnet 32 migctl
ddp resnet32-lockstep resnet 32 none --lockstep
ovh default
row np7-8K 7 8KiB 2000 200
row np7-256M-2 7 256MiB 10 3
timeout 100 python3 bin/gloo_allreduce.py --np 7 --sizes 256M --iters 3 >"$W/gloo.out" 2>&1
say "gloo-np7-256M rc=$? $(grep -v '^#' "$W/gloo.out" | tail -1)"
MIGCTL_TUNING=complete=device ddp resnet32-early resnet 32 migctl
ovh default-2
ddp resnet8-migctl resnet 8 migctl
ddp resnet8-gloo resnet 8 gloo
ddp gpt4-migctl gpt 4 migctl
ddp gpt4-gloo gpt 4 gloo
