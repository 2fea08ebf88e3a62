#!/usr/bin/env bash
# Call setup, CPU and memory: Parley's Linux engine against headless Chromium in the same run.
# Builds a release `parley`, installs Chromium when missing, and runs the benchmark in a private
# network namespace with only loopback, so no peer gathers candidates on a real interface.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh chromium
echo "== building parley (release; a first build on two cores takes about 20 minutes)"
swift build -c release --scratch-path .build-release --product parley
if [ "$(id -u)" -ne 0 ]; then
  echo "bench-calls.sh needs root for a network namespace (unshare --net)" >&2
  exit 1
fi
exec unshare --net bash -c 'ip link set lo up && exec .build-release/release/parley bench calls "$@"' bench "$@"
