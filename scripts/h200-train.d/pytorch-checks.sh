#!/usr/bin/env bash
# PyTorch backend checks on the GPU (issue 11), run by scripts/h200-train.sh: every op and dtype
# on CUDA tensors with 7 ranks on GPU 0, stream ordering and the Python overhead per call, DDP and
# the comm hook on torch 2.x. Prints one line per check and "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
export MIGCTL_LIB=$PWD/bin/libmigctl.so
M=bin/migctl
R=${OUT:-./pytorch-checks-out}; mkdir -p "$R"
pass=0 fail=0
check() { # check NAME NP -- CMD...
  local name=$1 np=$2; shift 3
  if timeout "${T:-150}" $M run --gpus 0 --np "$np" -q -- "$@" > "$R/$name.out" 2> "$R/$name.err"; then
    pass=$((pass+1)); echo "ok    $name"
  else
    fail=$((fail+1)); echo "FAIL  $name"; tail -4 "$R/$name.err"
  fi
  grep -h '^\[0\]: {' "$R/$name.out" "$R/$name.err" | head -2
}
python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
check ops-cuda-7 7 -- python3 python/tests/ops_check.py --device cuda --sizes 0,7,65539
check gpu-checks-7 7 -- python3 python/tests/gpu_checks.py
check ddp-hook-2 2 -- python3 python/tests/ddp_check.py
echo "$pass passed, $fail failed"
