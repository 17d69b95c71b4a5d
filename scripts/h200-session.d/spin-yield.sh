#!/usr/bin/env bash
# Spinning waits yield the P every poll (MIGCTL_SPIN_YIELD=1, as before) or every 64 polls (the new
# default), same call, one H200, 7 ranks on GPU 0: 8 KiB and 256 MiB bench rows (interleaved),
# the PyTorch per-call probe, DDP ResNet-18 b8 over migctl. Output: $OUT/spin/summary.txt, logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init spin
for y in 1 64 1 64; do MIGCTL_SPIN_YIELD=$y row "r7-8K-y$y" 7 8KiB 2000 200; done
for y in 1 64; do MIGCTL_SPIN_YIELD=$y row "r7-256M-y$y" 7 256MiB 10 3; done
for y in 1 64; do
  MIGCTL_SPIN_YIELD=$y N=1000 ROUNDS=5 timeout 90 $M run --gpus 0 --np 7 -q --timeout 60s -- \
    python3 python/tests/overhead_check.py --device cuda >"$W/ovh-y$y.out" 2>&1
  say "ovh np=7 y=$y rc=$? $(sed -n 's/^\[[0-9]*\]: \({.*}\)$/\1/p' "$W/ovh-y$y.out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print(" ".join(f"{k}={max(r[k] for r in rows):.1f}" for k in ("process_group_us", "c_abi_us", "c_run_us") if rows and k in rows[0]))')"
done
for y in 1 64; do
  MIGCTL_SPIN_YIELD=$y timeout 120 $M run --gpus 0 --np 7 -- python3 examples/pytorch/ddp_resnet.py --backend migctl \
    --batch 8 --steps 30 >"$W/ddp-y$y.out" 2>&1
  say "ddp resnet8 y=$y rc=$? $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/ddp-y$y.out" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("ms/step=%.1f" % r["step_ms_slowest_rank"])' 2>/dev/null)"
done
