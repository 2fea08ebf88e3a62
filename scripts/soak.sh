#!/usr/bin/env bash
# The chaos soak, long: random call flows from many devices while connections are cut, frames
# delayed and the server killed and restarted; then the checks (see `parley bench soak --help`).
#
#   scripts/soak.sh                         ten minutes, 40 users
#   scripts/soak.sh --seconds 3600 --users 100
#
# The test suite runs a short one (Tests/ParleyServerTests/SoakTests.swift).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
swift build --product parley 2>&1 | grep -E "error|Compiling|Build complete" | grep -v "^\[" || true
exec .build/debug/parley bench soak --seconds 600 --users 40 "$@"
