#!/usr/bin/env bash
# All-gather with each rank's own block copied on its device (47b4c97) against the build before it (a679005,
# own block back from the arena over the link), one GPU, ranks on GPU 0: `migctl bench allgather` 2 and 7
# ranks out of place, interleaved twice, and 2 ranks in place (no own copy either way), -c 1; then FSDP vs
# DDP (python/tests/fsdp_check.py) at 7 ranks, which all-gathers flat parameters every step.
# Build: make build lib; git worktree add /tmp/old a679005 && (cd /tmp/old && go build -ldflags='-s -w'
# -o "$OLDPWD/bin/migctl-old" ./cmd/migctl); carry ["bin/migctl", "bin/migctl-old", "bin/libmigctl.so"].
# Output: $OUT/allgather/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init allgather
ag() { coll "$1" "$2" "$3" allgather -b 64KiB -e 32MiB -f 8 -n 30 -w 3 "${@:4}"; } # tag binary np [args]
newold ag
timeout 200 $M run --gpus 0 --np 7 -q --timeout 60s -- python3 python/tests/fsdp_check.py >"$W/fsdp.out" 2>&1
say "fsdp_check 7 ranks rc=$? clean: $(grep -c '"failures": \[\]' "$W/fsdp.out") of 7"
