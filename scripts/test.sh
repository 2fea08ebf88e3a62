#!/usr/bin/env bash
# Builds Parley and runs every test. Installs what the build needs on a fresh Debian machine.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
dpkg -s libsqlite3-dev >/dev/null 2>&1 || need+=(libsqlite3-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing Debian packages: ${need[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi

echo "== building (a first build on two cores takes several minutes)"
swift build --build-tests
echo "== testing"
swift test --skip-build --disable-xctest
