#!/usr/bin/env bash
# Builds Parley and runs every test. Installs what the build and the tests need on a fresh Debian machine.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --tests

echo "== building (a first build on two cores takes several minutes)"
swift build --build-tests
echo "== testing"
swift test --skip-build --disable-xctest
