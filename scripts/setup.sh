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
go version >/dev/null || { echo "setup: Go 1.26 is required (https://go.dev/dl)" >&2; exit 1; }
go mod download
