#!/usr/bin/env bash
# The demo on a fresh machine: installs what is missing, builds, and makes a real call between two
# Linux softphones through an embedded server on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
echo "== building parley (a first build on two cores takes several minutes)"
swift build --product parley
exec .build/debug/parley demo "$@"
