#!/usr/bin/env bash
# Host memory under DMA (issue 9 item 3): `migctl bench limits --refresh` three times on an idle
# machine (the figures' spread), then the table from the cache. Prints per run the CPU-alone
# memory copy, the copies and the CPU reduction while both run, and host memory's total under
# DMA, and the host-memory floors that total gives the 256 MiB rows of 2026-12-01 (7 and 2 ranks
# on GPU 0, host-staged: (3n+1)·S through host memory) beside their measured times.
# Files in $OUT/limits-hostmem/: run-1..3.json, table.txt, stderr.txt, summary.txt. ~15-30 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp}/limits-hostmem; mkdir -p "$O"
: >"$O/stderr.txt"
fail=0
for i in 1 2 3; do
  if ! timeout 50 bin/migctl bench limits --gpu 0 --refresh -o json >"$O/run-$i.json" 2>>"$O/stderr.txt"; then
    echo "FAIL limits-hostmem: run $i: bin/migctl bench limits --refresh exited non-zero"; fail=1
  fi
done
timeout 20 bin/migctl bench limits --gpu 0 -o table >"$O/table.txt" 2>>"$O/stderr.txt" || { echo "FAIL limits-hostmem: table"; fail=1; }
cat "$O/table.txt"
python3 - "$O" <<'PY' | tee "$O/summary.txt"
import json, sys, os
O = sys.argv[1]
S = 256 * 2**20
rows = {7: 45.42, 2: 14.16}  # host-staged, --reduce-on cpu, docs/results/collectives-h200.md 14:48 UTC
ok = True
for i in (1, 2, 3):
    p = os.path.join(O, f"run-{i}.json")
    try:
        r = json.load(open(p))
    except Exception as e:
        print(f"FAIL run {i}: no JSON ({e})"); ok = False; continue
    h, g, m = r["limits"]["host"], r["limits"]["gpus"][0], r["machine"]
    need = [h.get("memoryGiBs", 0), g.get("contendedCopyGiBs", 0), g.get("contendedReduceGiBs", 0), g.get("hostMemUnderDMAGiBs", 0)]
    if min(need) <= 0:
        print(f"FAIL run {i}: a new figure is missing or 0: {need}"); ok = False; continue
    M = g["hostMemUnderDMAGiBs"]
    print(f"run {i}: CPU-alone memory {h['memoryGiBs']:.1f} GiB/s ({h['threads']} thr) | alone: duplex {g['duplexGiBs']:.1f}, "
          f"reduce {h['reduceHostGiBs']:.1f} GiB/s in | together ({g['contendedThreads']} thr): copies {g['contendedCopyGiBs']:.1f}, "
          f"reduce {g['contendedReduceGiBs']:.1f} GiB/s in | HOST MEM UNDER DMA {M:.1f} GiB/s (model cap {m.get('hostMemGiBs', 0):.1f})")
    for n, ms in rows.items():
        b = (3 * n + 1) * S
        floor = b / (M * 2**30) * 1e3
        duplex = 2 * n * S / (g["duplexGiBs"] * 2**30) * 1e3
        implied = b / (ms / 1e3) / 2**30
        tag = "PASS" if floor <= ms else "WARN(floor above the measured row: the figure is too low to be a cap)"
        print(f"  {tag} {n} ranks: hostmem floor {floor:.2f} ms vs duplex {duplex:.2f} ms; measured {ms} ms moved {implied:.0f} GiB/s "
              f"= {100 * implied / M:.0f}% of it")
print("PASS limits-hostmem: figures measured" if ok else "FAIL limits-hostmem")
sys.exit(0 if ok else 1)
PY
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
exit $fail
