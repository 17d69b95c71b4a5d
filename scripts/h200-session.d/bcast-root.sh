#!/usr/bin/env bash
# The root of an out-of-place broadcast copies its own receive buffer on the device from its send buffer,
# beside its copy out (this build, bin/migctl), rather than back from the slot after it (bin/migctl-old,
# the build before): `migctl bench broadcast` 2 and 7 ranks on GPU 0, out of place and in place, -c 1,
# interleaved twice; then the PyTorch per-call probe at 7 ranks (issue 11's ≤ 20 µs).
# Build: make build lib; go build -ldflags='-s -w' -o bin/migctl-old (the previous commit) ./cmd/migctl;
# carry ["bin/migctl", "bin/migctl-old", "bin/libmigctl.so"]. Output: $OUT/bcastroot/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init bcastroot
python3 -c 'import torch; print("torch", torch.__version__)' >>"$S" 2>&1
bc() { # tag binary np [bench args...]
  local tag=$1 bin=$2 np=$3; shift 3
  timeout 100 $bin bench broadcast --backend gpu --transport shm --gpu 0 --np "$np" -b 8KiB -e 32MiB -f 8 -n 50 -w 5 -c 1 \
    -o json "$@" >"$W/$tag.json" 2>"$W/$tag.err"
  say "$tag rc=$? $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join("%dB:%.1fus,w%d" % (r["bytes"], r["timeUs"], r["wrong"]) for r in d["rows"]))' "$W/$tag.json" 2>/dev/null || tail -c 300 "$W/$tag.err")"
}
newold bc
ovh default
