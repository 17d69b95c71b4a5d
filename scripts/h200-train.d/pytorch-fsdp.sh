#!/usr/bin/env bash
# FSDP over the migctl backend on the GPU (issue 11), run by scripts/h200-train.sh with
# ONLY=pytorch-fsdp (or alone from the repository root): python/tests/fsdp_check.py under
# `migctl run --gpus 0` at 7 ranks (the small GPT, FSDP FULL_SHARD vs DDP, 50 steps, losses to
# fp32 round-off), then fsdp_check and ops_check with the job split over two "nodes" of 2 ranks on
# GPU 0 (two `migctl run --nnodes 2` side by side: migctl inside each node, gloo between them, CUDA
# tensors), then ops_check with NCCL between the nodes: with 2 GPUs node i on GPU i, and on GPU 0
# with a NCCL_HOSTID per node (NCCL then takes the nodes for two hosts and joins them over its
# sockets, on the loopback interface), with fsdp_check too; and groups of some of the ranks across the
# two nodes (subgroup_check, FSDP1 HYBRID_SHARD and FSDP2 on a 2-D mesh: shard within a node).
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
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "gpus", torch.cuda.device_count())' | tee "$R/torch.txt"
if [ -z "${NCCL_ONLY:-}${SUBGROUPS_ONLY:-}" ]; then  # NCCL_ONLY=1: only the checks with NCCL between the nodes
  timeout 60 $M run --gpus 0 --np 7 -q --timeout 60s -- python3 python/tests/fsdp_check.py > "$R/fsdp-7.out" 2> "$R/fsdp-7.err"
  result "fsdp-vs-ddp-7-ranks" $? "$R/fsdp-7.out" "$R/fsdp-7.err"
fi

two_nodes() { # two_nodes NAME GPU_OF_NODE0 GPU_OF_NODE1 CMD...: 2 "nodes" of 2 ranks side by side
  local name=$1 g0=$2 g1=$3 i rc=0 port pids=()
  shift 3
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  export MIGCTL_JOB_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
  for i in 0 1; do
    local g=$g0; [ $i = 1 ] && g=$g1
    ${HOSTID_PER_NODE:+env NCCL_HOSTID=migctl-node$i NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET} \
    timeout 55 $M run --gpus "$g" --np 2 --nnodes 2 --node-rank $i --rdzv-endpoint 127.0.0.1:$port -q --timeout 60s \
      -- "$@" > "$R/$name-node$i.out" 2> "$R/$name-node$i.err" &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  result "$name" $rc "$R/$name-node0.out" "$R/$name-node0.err"
  [ -n "${HOSTID_PER_NODE:-}" ] && echo "  NCCL's NET/Socket lines: $(cat "$R/$name"-node*.out "$R/$name"-node*.err 2>/dev/null | grep -c 'NET/Socket')"
}
# groups of some of the ranks across two "nodes": the pairs within a node (migctl), the odd ranks across
# (gloo); FSDP's hybrid sharding sharded within each node and replicated across the nodes, FSDP1 and
# FSDP2 (a 2-D device mesh). SUBGROUPS_ONLY=1: only these.
if [ -z "${NCCL_ONLY:-}" ]; then
  two_nodes subgroups-cuda-2-nodes-x-2 0 0 python3 python/tests/subgroup_check.py --device cuda
  two_nodes fsdp-hybrid-2-nodes-x-2 0 0 python3 python/tests/fsdp_check.py --strategy hybrid
  two_nodes fsdp2-hybrid-2-nodes-x-2 0 0 python3 python/tests/fsdp_check.py --strategy fsdp2-hybrid
  [ -n "${SUBGROUPS_ONLY:-}" ] && { echo "$pass passed, $fail failed"; exit 0; }
fi
# the hierarchical path with CUDA tensors: migctl inside each node, gloo (host memory) between them
if [ -z "${NCCL_ONLY:-}" ]; then
  two_nodes fsdp-vs-ddp-2-nodes-x-2 0 0 python3 python/tests/fsdp_check.py
  two_nodes ops-cuda-2-nodes-x-2 0 0 python3 python/tests/ops_check.py --device cuda --sizes 0,7,65539 --large 0
fi
# NCCL between the nodes (MIGCTL_INTER_NODE=nccl): on two GPUs, then both nodes on GPU 0
export MIGCTL_INTER_NODE=nccl
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then
  two_nodes ops-cuda-2-nodes-x-2-nccl 0 1 python3 python/tests/ops_check.py --device cuda --sizes 0,7,65539 --large 0
else
  echo "(one GPU: NCCL between nodes on two GPUs skipped)"
fi
HOSTID_PER_NODE=1 two_nodes ops-cuda-2-nodes-x-2-nccl-1gpu 0 0 python3 python/tests/ops_check.py --device cuda \
  --sizes 0,7,65539 --large 0
HOSTID_PER_NODE=1 two_nodes fsdp-vs-ddp-2-nodes-x-2-nccl-1gpu 0 0 python3 python/tests/fsdp_check.py
unset MIGCTL_INTER_NODE
echo "$pass passed, $fail failed"
