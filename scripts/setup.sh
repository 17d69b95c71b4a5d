#!/usr/bin/env bash
# Installs what building and testing migctl needs on a fresh Debian machine
# (Go comes with the machine; gcc and make from Debian if missing) and fetches Go modules.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
need=()
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v make >/dev/null || need+=(make)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq "${need[@]}"
  else echo "setup: please install: ${need[*]}" >&2; exit 1; fi
fi
# Debian's torch (1.13, CPU) for /usr/bin/python3: the torch backend tests (python/, cmd/libmigctl)
# use it and skip with a message without it.
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch
  else echo "setup: for the torch backend tests: sudo apt-get install -y python3-torch" >&2; fi
fi
go version >/dev/null || { echo "setup: Go 1.26 is required (https://go.dev/dl)" >&2; exit 1; }
go mod download
