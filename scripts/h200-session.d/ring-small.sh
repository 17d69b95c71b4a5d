#!/usr/bin/env bash
# After ring-default.sh: small all-reduces of a group whose algorithm is the ring take the
# small-message path again (2 ranks, auto = ring on a measured host: 8 KiB and 64 KiB against
# --algo hoststaged); the 256-MiB pair once more; the GPU unit tests of device reductions
# (plain, staged for every reduction, staged when asked), verbose, with room to finish.
# Build: make build; go test -c -o bin/comm.test ./comm; carry ["bin"]. Output: $OUT/ringsmall. ~3 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200-session.d/lib.sh
session_init ringsmall
$M bench limits >/dev/null 2>&1
row r2-8K-default 2 8KiB 3000 300
row r2-8K-hoststaged 2 8KiB 3000 300 --algo hoststaged
row r2-64K-default 2 64KiB 2000 200
row r2-64K-hoststaged 2 64KiB 2000 200 --algo hoststaged
row r2-256M-default 2 256MiB 10 3
row r2-256M-hoststaged 2 256MiB 10 3 --algo hoststaged
timeout 200 bin/comm.test -test.v -test.run 'TestCUDADeviceGPUStagedReduce|TestCUDADeviceGPUReduce$' -test.count=1 >"$W/comm.txt" 2>&1
say "comm GPU reduce tests rc=$? $(grep -cE '^    --- PASS' "$W/comm.txt") subtests passed, $(grep -cE -- '--- FAIL' "$W/comm.txt") failed; $(grep -E '^(--- |ok|PASS|FAIL)' "$W/comm.txt" | tr '\n' ' ')"
