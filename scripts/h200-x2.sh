#!/usr/bin/env bash
# h200-x2.sh — what issues 9 and 11 still need two GPUs for, for the first session that gets an
# nvidia-h200-x2 machine (MIG stays off; nothing is changed on the GPUs), in two device calls of
# under ten minutes each:
#
#   PART=9   issue 9: scripts/h200-topology.sh (the target table: 7 and 2 ranks on GPU 0, 4 and 8
#            ranks on GPUs 0,1, 2 ranks one per GPU, 8 KiB; every --algo, LIMIT and %LIMIT, gloo in
#            the same run); the IPC ring, one rank per GPU, beside NCCL (8 KiB, 1 MiB, 256 MiB:
#            "the 2-GPU IPC ring stays at or above NCCL"); item 4 on two GPUs
#            (scripts/h200-session.d/nccl-2node.sh: two "nodes", one per GPU, NCCL on its sockets).
#            Build: make build && go test -c -trimpath -ldflags='-s -w' -o bin/trainer.test ./trainer
#                   && go test -c -trimpath -ldflags='-s -w' -o bin/nccl.test ./internal/nccl
#                   && cp ../shared/bench/gloo_allreduce.py bin/       (no libmigctl.so needed)
#   PART=11  issue 11: DDP with backend="migctl", one rank per GPU (the IPC ring), beside NCCL and
#            the no-communication bound, ResNet-18 and the GPT at both batches
#            (examples/pytorch/compare.sh NP=2 GPUS=0,1); then NCCL between two "nodes" on two
#            GPUs under PyTorch (scripts/h200-train.d/pytorch-fsdp.sh NCCL_ONLY=1: ops_check and
#            FSDP vs DDP with MIGCTL_INTER_NODE=nccl).
#            Build: make build lib; remove bin/sgd and the test binaries (64 MiB carry).
#
#   PART=quick  for a session with little device time left (~3 min): issue 9's two-GPU rows (4 ranks, 2 per
#            GPU, and 8 ranks, 4 per GPU, 256 MiB, auto, LIMIT and %; gloo beside them) and issue 11's ResNet-18
#            and GPT at batch 32, one rank per GPU, migctl (IPC ring) vs NCCL. Build: make build lib &&
#            cp ../shared/bench/gloo_allreduce.py bin/; carry ["bin/migctl", "bin/libmigctl.so",
#            "bin/gloo_allreduce.py"].
#
#   run: timeout 590 env PART=9 bash scripts/h200-x2.sh     (carry ["bin"])
#
# With fewer than two GPUs it says so and stops (nothing here means anything on one). Output under
# $OUT/x2-PART/: summary.txt (one line per check or row, the verdicts), the parts' own files, and
# logs. Each part prints its summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
PART=${PART:-9}
O=${OUT:-./x2-out}/x2-$PART; mkdir -p "$O"
S=$O/summary.txt; : >"$S"
say() { echo "$*" | tee -a "$S"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,mig.mode.current,memory.used --format=csv,noheader >"$O/gpus.txt" 2>&1
# a call for nvidia-h200-x2 may run on two H100s: the rows still run, and the summary names the cards (the
# issues' targets are an H200's)
ngpu=$(grep -c '^[0-9]' "$O/gpus.txt" || true)
say "PART=$PART, $(date -u +%FT%TZ), GPUs: $(paste -sd';' "$O/gpus.txt")"
grep -q H200 "$O/gpus.txt" || say "NOTE: not H200s: the figures are these cards', not the issues' targets' hardware"
if [ "${ngpu:-0}" -lt 2 ]; then
  say "fewer than 2 GPUs: nothing to do here (use nvidia-h200-x2 or nvidia-h100-x2)"
  exit 2
fi
need() { for f in "$@"; do [ -e "$f" ] || { say "missing $f: build it first (see the header)"; exit 2; }; done; }

case "$PART" in
9)
  need bin/migctl bin/trainer.test bin/nccl.test bin/gloo_allreduce.py
  say "== issue 9's table (h200-topology.sh)"
  OUT="$O/topology" timeout 420 scripts/h200-topology.sh >"$O/topology.log" 2>&1
  say "topology rc=$?"
  sed -n '/^| case/,$p' "$O/topology/table.md" 2>/dev/null | tee -a "$S"
  say "== the IPC ring, one rank per GPU, beside NCCL"
  timeout 90 bin/migctl bench allreduce --backend gpu --transport ipc --gpu 0,1 --np 2 -b 8KiB -e 256MiB -f 128 \
    -n 20 -w 3 -c 1 -o json >"$O/ipc2.json" 2>"$O/ipc2.err"
  say "ipc ring rc=$? $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join("%d B %.1f us (wrong %d)" % (r["bytes"], r["timeUs"], r["wrong"]) for r in d["rows"]))' "$O/ipc2.json" 2>/dev/null)"
  timeout 90 python3 scripts/peer_allreduce_multigpu.py --backend nccl --np 2 --sizes 8K,1M,256M --iters 20 \
    >"$O/nccl2.txt" 2>"$O/nccl2.err"
  say "nccl rc=$? $(paste -sd'|' "$O/nccl2.txt")"
  say "== item 4 on two GPUs (nccl-2node.sh)"
  OUT="$O" timeout 150 scripts/h200-session.d/nccl-2node.sh >"$O/nccl-2node.log" 2>&1
  say "nccl-2node rc=$? $(grep -E '^(PASS|FAIL|SKIP)' "$O/nccl-2node.log" | paste -sd'|')"
  ;;
11)
  need bin/migctl bin/libmigctl.so
  say "== DDP, one rank per GPU: migctl (IPC ring) vs NCCL vs no communication"
  NP=2 GPUS=0,1 BACKENDS="migctl nccl none" STEPS=40 OUT="$O/compare2.jsonl" timeout 360 \
    examples/pytorch/compare.sh >"$O/compare2.log" 2>&1
  say "compare rc=$?"
  sed -n '/^|/p' "$O/compare2.log" | tee -a "$S"
  python3 - "$O/compare2.jsonl" <<'PY' | tee -a "$S"
import json, sys
rows = {}
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    rows[(r.get("model"), r.get("batch_per_rank"), r.get("backend"))] = r
for (model, batch, backend), r in sorted(rows.items(), key=lambda kv: str(kv[0])):
    if backend != "migctl":
        continue
    n = rows.get((model, batch, "nccl"))
    if n:
        m, q = r["step_ms_median_slowest_rank"], n["step_ms_median_slowest_rank"]
        print(f"{model} b{batch}: migctl {m:.1f} ms, nccl {q:.1f} ms: {q / m * 100:.0f}% of NCCL's steps/s "
              f"(must >= 90%, goal >= 100%), ranks identical {r.get('ranks_identical')}")
PY
  say "== NCCL between two nodes, one per GPU (pytorch-fsdp.sh NCCL_ONLY=1)"
  OUT="$O" NCCL_ONLY=1 timeout 200 scripts/h200-train.d/pytorch-fsdp.sh >"$O/fsdp.log" 2>&1
  say "pytorch-fsdp rc=$? $(grep -E '^(PASS|FAIL)' "$O/fsdp.log" | cut -c1-160 | paste -sd'|') $(tail -1 "$O/fsdp.log")"
  ;;
quick)
  need bin/migctl bin/libmigctl.so bin/gloo_allreduce.py
  for np in 4 8; do
    timeout 100 bin/migctl bench allreduce --backend gpu --transport shm --gpu 0,1 --np $np -b 256MiB -e 256MiB \
      -n 10 -w 3 -c 1 -o json >"$O/np$np.json" 2>"$O/np$np.err"
    say "np$np on 2 GPUs 256 MiB rc=$? $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["rows"][0]; print("%.2f ms wrong=%d algo=%s limit=%.2f ms %%limit=%.1f binding=%s" % (r["timeUs"] / 1e3, r["wrong"], d.get("algorithm"), r.get("limitUs", 0) / 1e3, r.get("pctLimit", 0), r.get("limitBinding")))' "$O/np$np.json" 2>/dev/null || tail -c 300 "$O/np$np.err")"
  done
  timeout 100 python3 bin/gloo_allreduce.py --np 4,8 --gpus 0,1 --sizes 256M --iters 3 >"$O/gloo2.txt" 2>&1
  say "gloo rc=$? $(grep -v '^#' "$O/gloo2.txt" | paste -sd'|')"
  for m in resnet gpt; do
    for b in migctl nccl; do
      timeout 80 bin/migctl run --gpus 0,1 --np 2 -q -- python3 examples/pytorch/ddp_$m.py --backend $b --batch 32 \
        --steps 25 2>"$O/$m-$b.err" | sed -n 's/^\[0\]: \({.*}\)$/\1/p' >"$O/$m-$b.json"
      say "$m b32 $b rc=$? $(python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); print("ms/step=%.1f identical=%s" % (r["step_ms_median_slowest_rank"], r["ranks_identical"]))' "$O/$m-$b.json" 2>/dev/null || tail -c 200 "$O/$m-$b.err")"
    done
  done
  ;;
*)
  say "PART=$PART: want 9, 11 or quick"
  exit 2
  ;;
esac
say "done in ${SECONDS}s"
