#!/usr/bin/env bash
# priority-bench (helper H4, issue 10 D1) for the lead's GPU call: scripts/h200-priority.sh with
# 10-s windows (1000 requests) so that the nine cases fit in under 4 minutes (a case that would not fit prints
# SKIP). Needs bin/migctl and bin/libmigswap.so (make build shim); the gate/budget/depth/slicing cases
# SKIP with the reason when bin/ lacks those features. Read-only nvidia-smi queries only.
# Logs, table.md, summary.txt, results.json under $OUT/priority-bench/priority/.
# Last lines: PASS/FAIL/SKIP per case, then TARGET lines (issue 10's p99 and throughput targets).
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp}/priority-bench
mkdir -p "$O"
OUT="$O" DURATION=${DURATION:-10} BUDGET=${BUDGET:-205} TOTAL_TIMEOUT=${TOTAL_TIMEOUT:-225} \
  scripts/h200-priority.sh --startup-timeout 60 > "$O/run.txt" 2>&1
rc=$?
grep -E "^\| |^(PASS|FAIL|SKIP|TARGET) " "$O/run.txt"
echo "priority-bench: rc=$rc (full output $O/run.txt)"
exit $rc
