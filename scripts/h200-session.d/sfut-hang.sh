#!/usr/bin/env bash
# Where DDP hangs with stream-ordered Futures (stream-futures.sh: ResNet-18 and GPT runs timed out,
# gpu_checks passed): each rank dumps its Python threads' stacks after 40 s (faulthandler); the same
# with CUDA_DEVICE_MAX_CONNECTIONS=32 (fewer streams sharing a hardware queue with a stream that
# waits for host memory). Build: make build lib; carry ["bin"]. Output: $OUT/sfuthang/. ~4 minutes.
# Record of a call on a build with stream-ordered Futures (commit 33e326e, reverted after it).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init sfuthang
hang() { # tag model batch [VAR=value...]
  local tag=$1 model=$2 batch=$3; shift 3
  env "$@" timeout 55 $M run --gpus 0 --np 7 -q -- python3 -X faulthandler -c "
import faulthandler, runpy, sys
faulthandler.dump_traceback_later(40, exit=True)
sys.path.insert(0, 'examples/pytorch')
sys.argv = ['examples/pytorch/ddp_$model.py', '--backend', 'migctl', '--batch', '$batch', '--steps', '25']
runpy.run_path(sys.argv[0], run_name='__main__')" >"$W/$tag.out" 2>&1
  say "$tag rc=$? $(sed -n 's/^\[0\]: \({.*}\)$/\1/p' "$W/$tag.out" | python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); print("ms/step=%.1f identical=%s" % (r["step_ms_median_slowest_rank"], r["ranks_identical"]))' 2>/dev/null) stacks=$(grep -c 'Thread 0x' "$W/$tag.out")"
  grep '^\[0\]' "$W/$tag.out" | grep -A8 'Thread 0x\|Current thread' | grep -v Warning | head -40 >>"$S"
}
hang resnet8-on resnet 8
hang resnet8-on-conn32 resnet 8 CUDA_DEVICE_MAX_CONNECTIONS=32
hang gpt4-on-conn32 gpt 4 CUDA_DEVICE_MAX_CONNECTIONS=32
