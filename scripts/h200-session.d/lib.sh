# Sourced by the session scripts of scripts/h200-session.d (bash, repository root): a summary in
# $O/summary.txt, every other file under $W tarred into $O/logs.tgz at exit (what comes back from
# the device is few files), and `row`, one `migctl bench allreduce` row on GPU 0 with its figures.
# session_init NAME sets O (under $OUT), W (a temp dir), M, S and the trap.
session_init() {
  O=${OUT:-/tmp}/$1; mkdir -p "$O"
  W=$(mktemp -d "/tmp/$1.XXXXXX")
  M=bin/migctl
  export MIGCTL_LIB=$PWD/bin/libmigctl.so PYTHONUNBUFFERED=1
  S=$O/summary.txt; : >"$S"
  trap session_finish EXIT
  nvidia-smi --query-gpu=name,driver_version,mig.mode.current --format=csv,noheader >>"$S" 2>&1
}
say() { echo "$*" | tee -a "$S"; }
session_finish() { tar -C "$W" -czf "$O/logs.tgz" . 2>/dev/null; say "done in ${SECONDS}s"; }
row() { # tag np size n w [bench args...]: shm, host-staged path, -c 1; JSON in $W/tag.json
  local tag=$1 np=$2 size=$3 n=$4 w=$5; shift 5
  timeout 150 $M bench allreduce --backend gpu --transport shm --gpu 0 --np "$np" -b "$size" -e "$size" \
    -n "$n" -w "$w" -c 1 -o json "$@" >"$W/$tag.json" 2>"$W/$tag.err"
  local rc=$?
  say "$tag rc=$rc $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["rows"][0]; print("us=%.1f wrong=%d mps=%s limit=%.1f %%limit=%.1f binding=%s" % (r["timeUs"], r["wrong"], d.get("mps", False), r.get("limitUs", 0), r.get("pctLimit", 0), r.get("limitBinding")))' "$W/$tag.json" 2>/dev/null || tail -c 300 "$W/$tag.err")"
}
