#!/usr/bin/env bash
# FSDP over the migctl backend on the GPU (issue 11), run by scripts/h200-train.sh with
# ONLY=pytorch-fsdp (or alone from the repository root): python/tests/fsdp_check.py under
# `migctl run --gpus 0` at 4 and 7 ranks (the small GPT, FSDP FULL_SHARD vs DDP, 50 steps, losses
# to fp32 round-off), then fsdp_check with the job split over two "nodes" on GPU 0 (two
# `migctl run --nnodes 2` side by side: migctl inside each node, gloo between them, CUDA tensors).
# Needs bin/migctl and bin/libmigctl.so (make build lib), torch 2.x with CUDA. Logs under
# $OUT/pytorch-fsdp/; one PASS/FAIL line per check; last line "N passed, N failed". < 4 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${OUT:-./h200-out}/pytorch-fsdp; mkdir -p "$R"
export MIGCTL_LIB=$PWD/bin/libmigctl.so PYTHONUNBUFFERED=1
M=bin/migctl
pass=0 fail=0
result() { # result NAME RC OUTFILE...
  local name=$1 rc=$2; shift 2
  local line; line=$(grep -h '^\[0\]: {' "$@" 2>/dev/null | head -1 | sed 's/^\[0\]: //')
  if [ "$rc" = 0 ] && [ -n "$line" ] && ! grep -q '"skipped"' <<<"$line"; then
    pass=$((pass+1)); echo "PASS $name: $(cut -c 1-300 <<<"$line")"
  else
    fail=$((fail+1)); echo "FAIL $name (rc $rc): $(cut -c 1-300 <<<"$line")"; tail -n 6 "$@" 2>/dev/null | cut -c 1-300
  fi
}
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' | tee "$R/torch.txt"
for np in 4 7; do
  timeout 55 $M run --gpus 0 --np $np -q --timeout 60s -- python3 python/tests/fsdp_check.py \
    > "$R/fsdp-$np.out" 2> "$R/fsdp-$np.err"
  result "fsdp-vs-ddp-$np-ranks" $? "$R/fsdp-$np.out" "$R/fsdp-$np.err"
done
# two "nodes" of 2 ranks on GPU 0: the hierarchical path with CUDA tensors
token() { python3 -c 'import secrets; print(secrets.token_hex(16))'; }
export MIGCTL_JOB_TOKEN=$(token)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for i in 0 1; do
  timeout 60 $M run --gpus 0 --np 2 --nnodes 2 --node-rank $i --rdzv-endpoint 127.0.0.1:$port -q --timeout 60s \
    -- python3 python/tests/fsdp_check.py > "$R/fsdp-2x2-node$i.out" 2> "$R/fsdp-2x2-node$i.err" &
done
rc=0; for j in $(jobs -p); do wait "$j" || rc=$?; done
result "fsdp-vs-ddp-2-nodes-x-2" $rc "$R/fsdp-2x2-node0.out" "$R/fsdp-2x2-node0.err"
export MIGCTL_JOB_TOKEN=$(token)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for i in 0 1; do
  timeout 60 $M run --gpus 0 --np 2 --nnodes 2 --node-rank $i --rdzv-endpoint 127.0.0.1:$port -q --timeout 60s \
    -- python3 python/tests/ops_check.py --device cuda --sizes 0,7,65539 --large 0 \
    > "$R/ops-2x2-node$i.out" 2> "$R/ops-2x2-node$i.err" &
done
rc=0; for j in $(jobs -p); do wait "$j" || rc=$?; done
result "ops-cuda-2-nodes-x-2" $rc "$R/ops-2x2-node0.out" "$R/ops-2x2-node0.err"
echo "$pass passed, $fail failed"
