#!/usr/bin/env bash
# The main job: partition a node, then run collectives between its instances.
# Without a GPU it uses the simulated H200 node and the host-memory backend.
set -euo pipefail
cd "$(dirname "$0")/.."
M=bin/migctl
state=$(mktemp -d)/node.json
echo "== migctl partition apply on a simulated 8x H200 node"
$M partition apply --sim h200x8 --sim-state "$state" --gpus all --layout '3g.71gb=1,2g.35gb=1,1g.18gb=1'
$M partition show --sim h200x8 --sim-state "$state"
echo "== migctl bench allreduce, 4 ranks, host backend, results checked"
$M bench allreduce --np 4 --backend host -b 8K -e 64M -f 8 -c 1
